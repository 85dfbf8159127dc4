"""What each stream of the camera daemon does: from the command line, and from an
optional TOML file (``--config cams.toml``) with one ``[[stream]]`` table per stream::

    name = "camd"                 # server name, if --name is not given
    wake = "handoff"              # "all" or "handoff", if --wake is not given (default: $MSGQ_WAKE, else all)
    [[stream]]
    name = "road"                 # required; every other key defaults to the command line's value
    source = "synthetic"          # or a video file, or /dev/video0
    width = 640
    height = 480
    fps = 20                      # default: a video file's own rate, else 20
    format = "nv12"
    frames = 0                    # 0: run until stopped
    drop_frames = [10, 20]        # or "10,20"
    delay_frames = "30:50,40:120" # or {30 = 50, 40 = 120}

Fault injection (``--drop-frames`` / ``--delay-frames`` or the keys above):
a dropped frame id is captured but never published (ids keep counting, so a
client sees a gap); a delayed frame is published that many ms after its
``timestamp_eof`` while capture keeps its schedule (frames captured meanwhile
queue behind it, in order).
"""

import argparse
import dataclasses
import math
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Union

from msgq.errors import InvalidArgumentError
from visionipc.apps._cli import UsageError
from visionipc.formats import FORMATS, layout, normalize_format

DEFAULT_FPS = 20.0
TOP_KEYS = {"name", "wake", "stream"}
STREAM_KEYS = {"name", "source", "width", "height", "fps", "format", "frames", "drop_frames", "delay_frames", "loop"}


@dataclasses.dataclass
class StreamConfig:
    name: str
    source: str = "synthetic"
    width: int = 640
    height: int = 480
    fps: Optional[float] = None  # None: resolve_fps() after the source is open
    format: str = "nv12"
    frames: int = 0
    # the command line's or the file's spec until check() parses it
    drop_frames: FrozenSet[int] = frozenset()
    delay_frames: Dict[int, float] = dataclasses.field(default_factory=dict)
    loop: bool = False

    def check(self) -> "StreamConfig":
        where = f"stream {self.name!r}"
        for key in ("width", "height", "frames"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "frames" else 1):
                raise UsageError(
                    f"{where}: {key} must be a {'non-negative' if key == 'frames' else 'positive'} int, got {value!r}"
                )
        if self.fps is not None:
            self.check_fps()
        try:
            self.format = normalize_format(self.format)
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        try:
            layout(self.format, self.width, self.height)  # the core's rules: an even size for YUV 4:2:0...
        except InvalidArgumentError as e:
            raise UsageError(f"{where}: {e}, got {self.width}x{self.height}") from None
        self.drop_frames = parse_drop_frames(self.drop_frames)
        self.delay_frames = parse_delay_frames(self.delay_frames)
        return self

    def check_fps(self) -> None:
        fps = self.fps
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or math.isnan(fps) or not 0 < fps <= 10000:
            raise UsageError(f"stream {self.name!r}: fps must be a number in (0, 10000], got {fps!r}")

    def resolve_fps(self, source: object) -> None:
        """No fps given: a video file's own rate (when it has a sane one), else DEFAULT_FPS."""
        if self.fps is None:
            own = getattr(source, "file_fps", 0.0)
            self.fps = own if 0 < own <= 1000 else DEFAULT_FPS
        self.check_fps()

    def max_delay_frames(self) -> int:
        """Frames that can be captured while the longest delayed one waits."""
        longest = max(self.delay_frames.values(), default=0)
        if not longest:
            return 0
        assert self.fps is not None, "resolve_fps() first"
        return math.ceil(longest / 1000 * self.fps) + 1


def _frame_id(text: object, what: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a frame id") from None
    if not 0 <= value < 1 << 63:
        raise UsageError(f"{what}: frame id {value} out of range")
    return value


def parse_drop_frames(spec: Union[str, Iterable[Union[int, str]]]) -> FrozenSet[int]:
    """``"10,20,35"`` (or a list of ints) -> frozenset of frame ids."""
    if isinstance(spec, (set, frozenset)):
        return frozenset(spec)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return frozenset(_frame_id(x, "--drop-frames") for x in items if str(x).strip())


def parse_delay_frames(spec: Union[str, Mapping[Any, Any], Iterable[str]]) -> Dict[int, float]:
    """``"30:50,40:120"`` (frame_id:milliseconds), or a dict -> {frame_id: ms}."""
    if isinstance(spec, dict):
        pairs = list(spec.items())
    else:
        pairs = []
        for item in spec.split(",") if isinstance(spec, str) else spec:
            if not str(item).strip():
                continue
            frame, sep, ms = str(item).partition(":")
            if not sep:
                raise UsageError(f"--delay-frames: {item!r} is not FRAME_ID:MILLISECONDS (e.g. 30:50)")
            pairs.append((frame, ms))
    delays: Dict[int, float] = {}
    for frame, ms in pairs:
        try:
            value = float(ms)
        except (TypeError, ValueError):
            raise UsageError(f"--delay-frames: delay {ms!r} of frame {frame} is not a number of milliseconds") from None
        if not 0 <= value <= 60000:
            raise UsageError(f"--delay-frames: delay {value} ms of frame {frame} is outside 0..60000")
        delays[_frame_id(frame, "--delay-frames")] = value
    return delays


def load_toml(path: str) -> Dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise UsageError("--config needs Python 3.11+ or: pip install tomli") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"config file {path!r} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"cannot read config file {path!r}: {e}") from None


def build_streams(args: argparse.Namespace, config: Mapping[str, Any]) -> List[StreamConfig]:
    """Streams of the config file, then those named by ``--stream``; the command
    line's values are every stream's defaults."""
    defaults = dict(
        source=args.source,
        width=args.width,
        height=args.height,
        fps=args.fps,
        format=args.format,
        frames=args.frames,
        drop_frames=args.drop_frames,
        delay_frames=args.delay_frames,
        loop=args.loop,
    )
    unknown = set(config) - TOP_KEYS
    if unknown:
        raise UsageError(f"config: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(TOP_KEYS))})")
    entries = config.get("stream", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError("config: streams are [[stream]] tables")
    streams = []
    for entry in entries:
        unknown = set(entry) - STREAM_KEYS
        if unknown:
            raise UsageError(
                f"config: unknown key(s) {', '.join(sorted(unknown))} in a [[stream]] "
                f"(known: {', '.join(sorted(STREAM_KEYS))})"
            )
        if "name" not in entry:
            raise UsageError("config: every [[stream]] needs a name")
        streams.append(StreamConfig(**{**defaults, **entry}))
    streams += [StreamConfig(name=name, **defaults) for name in args.stream or ()]
    if not streams:
        raise UsageError("no stream: give --stream NAME (or [[stream]] tables in --config)")
    names = [s.name for s in streams]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"stream(s) {', '.join(dupes)} given twice")
    return [s.check() for s in streams]


__all__ = ["StreamConfig", "build_streams", "load_toml", "parse_drop_frames", "parse_delay_frames", "FORMATS"]
