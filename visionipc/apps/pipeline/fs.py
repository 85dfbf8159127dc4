"""Recordings and results by URI: local paths, ``file://``, ``s3://``, and whatever
``pyarrow.fs`` (``gs://``, ``hdfs://``, ``abfs://``) or an installed ``fsspec``
implementation reaches. All I/O is Python-side (pyarrow), in the driver for listings
and small files and in the executors for index files, video segments and results:
no Hadoop filesystem jars are needed on the cluster.

``s3a://`` and ``s3n://`` (Hadoop's names for the same buckets, as Spark users write them)
are taken as ``s3://``: ``normalize`` rewrites them, so a run names its inputs the same
whichever was given.

Credentials come the standard way of each filesystem (for S3: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE``, ``AWS_REGION``, and ``AWS_ENDPOINT_URL`` for an
S3-compatible server). A location is kept as a string everywhere (a URI, or an
absolute local path), so it travels to the executors as is.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from functools import lru_cache
from typing import IO, Any, Dict, Iterator, List, Tuple, Type, Union

FileSystem = Any  # a pyarrow.fs.FileSystem (pyarrow has no types)


class StorageError(ValueError):
    """A location no filesystem here can reach (bad input: exit 2)."""


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(location: str) -> str:
    """``"s3"`` for ``s3://b/k``, ``""`` for a local path (``file://`` counts as local)."""
    m = _SCHEME.match(str(location))
    return "" if m is None or m.group(1).lower() == "file" else m.group(1).lower()


def is_local(location: str) -> bool:
    return scheme(location) == ""


S3_ALIASES = ("s3a", "s3n")  # Hadoop's S3 filesystems: the same bucket and keys as s3://


def normalize(location: Union[str, "os.PathLike[str]"]) -> str:
    """An absolute local path, or the URI without a trailing slash (``s3a://``: ``s3://``)."""
    location = os.fspath(location)
    if scheme(location) in S3_ALIASES:
        location = "s3" + location[location.index("://") :]
    if is_local(location):
        if location.startswith("file://"):
            location = location[len("file://") :]
        return os.path.abspath(location)
    return location.rstrip("/")


def join(location: str, *parts: str) -> str:
    if is_local(location):
        return os.path.join(location, *parts)
    return "/".join([location.rstrip("/"), *(p.strip("/") for p in parts)])


def basename(location: str) -> str:
    return location.rstrip("/").rsplit("/", 1)[-1]


def parent(location: str) -> str:
    return os.path.dirname(location) if is_local(location) else location.rstrip("/").rsplit("/", 1)[0]


@lru_cache(maxsize=32)
def _remote(root: str) -> Tuple[FileSystem, str]:
    """(pyarrow FileSystem, path prefix) for the bucket/host of a URI; fsspec as the fallback."""
    import pyarrow.fs as pafs

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if root.startswith("s3://") and endpoint and "?" not in root:  # an S3-compatible server
        m = re.match(r"^(https?)://(.+?)/?$", endpoint)
        if m is None:
            raise StorageError(f"AWS_ENDPOINT_URL {endpoint!r} is not an http(s) URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return pafs.S3FileSystem(endpoint_override=m.group(2), scheme=m.group(1), region=region), root[5:]
    try:
        return pafs.FileSystem.from_uri(root)
    except pa_errors() + (ValueError,):
        pass
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(root)
    except ImportError:
        raise StorageError(f"{root}: no pyarrow filesystem for this scheme, and no fsspec installed") from None
    except (ValueError, OSError) as e:
        raise StorageError(f"{root}: {e}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def pa_errors() -> Tuple[Type[Exception], ...]:
    import pyarrow as pa

    return (pa.ArrowException, OSError)


def resolve(location: str) -> Tuple[FileSystem, str]:
    """``(pyarrow FileSystem, path inside it)`` of a location."""
    import pyarrow.fs as pafs

    location = normalize(location)
    if is_local(location):
        return pafs.LocalFileSystem(), location
    m = re.match(r"^([^:]+://[^/]*)(/.*)?$", location)
    assert m is not None  # a location that is not local has a scheme
    fs, root_path = _remote(m.group(1))
    rest = (m.group(2) or "").strip("/")
    return fs, f"{root_path.rstrip('/')}/{rest}".strip("/") if rest else root_path


def info(location: str) -> Any:
    fs, path = resolve(location)
    return fs.get_file_info(path)


def exists(location: str) -> bool:
    import pyarrow.fs as pafs

    return info(location).type != pafs.FileType.NotFound


def isdir(location: str) -> bool:
    import pyarrow.fs as pafs

    return info(location).type == pafs.FileType.Directory


def isfile(location: str) -> bool:
    import pyarrow.fs as pafs

    return info(location).type == pafs.FileType.File


def listdir(location: str, *, recursive: bool = False) -> List[Tuple[str, bool, int]]:
    """``[(relative name, is_dir, size)]`` below a folder (sorted), ``[]`` when it is none."""
    import pyarrow.fs as pafs

    fs, path = resolve(location)
    try:
        found = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
    except (NotADirectoryError, FileNotFoundError):
        return []
    prefix = path.rstrip("/") + "/"
    out = [(f.path[len(prefix) :], f.type == pafs.FileType.Directory, f.size or 0) for f in found]
    return sorted(out)


def file_stats(location: str) -> Dict[str, Tuple[int, int]]:
    """``{relative name: (size, mtime_ns)}`` of the files below a folder, from one recursive
    listing (object stores give both in their listings: no request per file)."""
    import pyarrow.fs as pafs

    fs, path = resolve(location)
    try:
        found = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=True))
    except (NotADirectoryError, FileNotFoundError):
        return {}
    cut = len(path.rstrip("/")) + 1
    return {f.path[cut:]: (f.size, f.mtime_ns) for f in found if f.type == pafs.FileType.File}


def relative(folder: str, location: str) -> str:
    """``location`` as a ``/``-separated path below ``folder`` (both as find_recordings gives them)."""
    folder, location = normalize(folder), normalize(location)
    if is_local(folder):
        return os.path.relpath(location, folder).replace(os.sep, "/")
    return location[len(folder) :].lstrip("/") if location.startswith(folder + "/") else location


def open_member(folder: str, relpath: str) -> IO[bytes]:
    """A binary, seekable file object of the file ``relpath`` a recording names: local, it is
    opened by visionipc.apps.record.checks.open_file (a regular file inside ``folder``, no
    symlink, FIFO or device); remote, ``relpath`` must still stay inside ``folder``."""
    from visionipc.apps.record.checks import check_relpath, open_file

    if is_local(folder):
        return os.fdopen(open_file(normalize(folder), relpath), "rb")
    check_relpath(relpath, folder)
    fs, path = resolve(join(folder, relpath))
    return fs.open_input_file(path)


def read_member(folder: str, relpath: str, limit: int) -> bytes:
    """The bytes of ``open_member``; more than ``limit``: RecordingError."""
    from visionipc.apps.record.checks import RecordingError

    with open_member(folder, relpath) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RecordingError(f"{join(folder, relpath)}: larger than {limit} bytes: not a file this format writes")
    return data


def member_exists(folder: str, relpath: str) -> bool:
    """Whether anything is there (locally a dangling symlink too: open_member refuses it)."""
    if is_local(folder):
        return os.path.lexists(os.path.join(normalize(folder), relpath))
    return exists(join(folder, relpath))


def read_bytes(location: str) -> bytes:
    fs, path = resolve(location)
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes(location: str, data: bytes, below: str | None = None) -> None:
    """Write ``data`` to ``location``, making its folders (``below``: only those under that
    folder, which must exist: see makedirs_below)."""
    fs, path = resolve(location)
    if below is None:
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    else:
        makedirs_below(below, location.rsplit("/", 1)[0])
    with fs.open_output_stream(path) as f:
        f.write(data)


def makedirs_below(root: str, location: str) -> None:
    """The folders from ``root`` down to ``location``, ``root`` not included: a Spark task's
    output folder inside a run's folder. When the driver abandoned the run (a task failed)
    and removed its folder while another task still ran, that task's write fails here
    instead of making the run's folder again (object storage has no folders: nothing to do)."""
    fs, path = resolve(location)
    if not is_local(root):
        fs.create_dir(path, recursive=True)
        return
    top = normalize(root)
    rel = os.path.relpath(path, top)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise ValueError(f"{location} is not below {root}")
    if not os.path.isdir(top):
        raise FileNotFoundError(f"{top}: the run's folder is gone (the run failed and was removed)")
    folder = top
    for part in [] if rel == os.curdir else rel.split(os.sep):
        folder = os.path.join(folder, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder)  # FileNotFoundError when the run's folder went meanwhile


def makedirs(location: str) -> None:
    fs, path = resolve(location)
    fs.create_dir(path, recursive=True)


def delete_dir(location: str) -> None:
    """Remove a folder and everything in it (nothing when it does not exist)."""
    fs, path = resolve(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)


def upload_dir(local_dir: str, location: str) -> None:
    """Copy the files below a local folder to a location (a local folder: moved in place)."""
    if is_local(location):
        os.makedirs(location, exist_ok=True)
        for name in os.listdir(local_dir):
            shutil.move(os.path.join(local_dir, name), os.path.join(location, name))
        return
    import pyarrow.fs as pafs

    fs, path = resolve(location)
    pafs.copy_files(local_dir, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


@contextlib.contextmanager
def local_copy(location: str, *members: str) -> Iterator[str]:
    """A local folder holding ``members`` (paths relative to ``location``): the folder
    itself when it is local, else a temporary copy removed afterwards (a video segment
    fetched by the executor that decodes it)."""
    if is_local(location):
        yield location
        return
    tmp = tempfile.mkdtemp(prefix="vipc-analyze-")
    try:
        for member in members:
            dest = os.path.join(tmp, member)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(read_bytes(join(location, member)))
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
