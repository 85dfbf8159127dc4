"""vipc-record / vipc-replay: recordings of VisionIPC streams (docs/recording-format.md)."""
