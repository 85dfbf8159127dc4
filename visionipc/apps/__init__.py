"""Applications built on the visionipc library, one package each:

    camera/    vipc-camera: the camera daemon (synthetic pattern, video file, V4L2)
    record/    vipc-record / vipc-replay: recordings and their replay
    view/      vipc-view: live preview in the browser and in OpenCV windows
    pipeline/  vipc-analyze: the Spark pipeline over recordings

They depend on the library (``visionipc``, ``msgq``); the library never imports them.
The benchmark harness is ``visionipc.bench``.
"""
