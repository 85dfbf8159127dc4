"""``printable(text)``: any name or message a tool prints, safe for a terminal and on one
line. File names in /dev/shm, recordings and HTTP requests come from other users or
untrusted files: an ESC sequence or a newline in one must not reach the terminal as is.

Printable characters stay (so ordinary names look the same, and escaping twice
changes nothing); control characters (ESC, newline, ...), invisible format characters
(bidi overrides) and the bytes of a name that is not UTF-8 (``os.listdir`` hands them
back as surrogates) become ``\\x1b``, ``\\n``, ``\\u202e``, ``\\xff``.
"""


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, kept by the surrogateescape handler
        return f"\\x{code - 0xDC00:02x}"
    if ch.isprintable():
        return ch
    return ch.encode("unicode_escape").decode("ascii")


def printable(text: object) -> str:
    """``text`` (str or bytes) with every character a terminal would act on escaped."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    text = str(text)
    if text.isprintable():
        return text
    return "".join(_escape(ch) for ch in text)
