"""visionipc: zero-copy video frames over shared memory (frame pools arrive with the VisionIPC server)."""
