"""Which format a media file is, from its first bytes, and whether the part's kind takes it.

The leading bytes decide, not a file name, a data URI's media type or an HTTP Content-Type:
those are easy to get wrong or to fake, and the decoders are then told which single format to
read, so FFmpeg never probes an input as some other (network-capable) container.

Formats taken: images JPEG and PNG (the documented ones) plus WebP and GIF, which Pillow
decodes and OpenAI-style clients send (an animated GIF or WebP gives its first frame); videos
MP4 (the ISO family, including MOV), AVI and WMV (ASF); audio MP3, WAV and FLAC.
"""

from __future__ import annotations

from ferrollm.media.errors import INVALID_MEDIA, UNSUPPORTED_CONTENT_TYPE, MediaError
from ferrollm.media.options import AUDIO, IMAGE, VIDEO

#: Format -> its kind.
FORMAT_KINDS = {
    "jpeg": IMAGE,
    "png": IMAGE,
    "webp": IMAGE,
    "gif": IMAGE,
    "mp4": VIDEO,
    "avi": VIDEO,
    "wmv": VIDEO,
    "mp3": AUDIO,
    "wav": AUDIO,
    "flac": AUDIO,
}

_ISO_IMAGE_BRANDS = frozenset(
    {b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1"}
)
_ASF_GUID = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")


def sniff_format(data: bytes) -> str | None:
    """The format of ``data`` (a key of `FORMAT_KINDS`), or None when it is none of them."""
    head = data[:32]
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head[:4] == b"RIFF" and len(head) >= 12:
        return {b"WEBP": "webp", b"AVI ": "avi", b"WAVE": "wav"}.get(head[8:12])
    if head[4:8] == b"ftyp":
        # HEIF and AVIF images share the ISO container; they are not videos (nor taken).
        return None if head[8:12] in _ISO_IMAGE_BRANDS else "mp4"
    if head.startswith(_ASF_GUID):
        return "wmv"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"ID3"):
        return "mp3"
    # An MPEG audio frame header without ID3 tags: 11 sync bits, layer III.
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06 == 0x02:
        return "mp3"
    return None


def check_format(data: bytes, kind: str, part_path: str, part_type: str) -> str:
    """The format of ``data``; raises MediaError unless it is one ``kind`` takes: an empty
    file is ``invalid_media``, a known format of another kind or an unknown one
    ``unsupported_content_type``, each naming the part."""
    if not data:
        raise MediaError(part_path, INVALID_MEDIA, "the media is empty (0 bytes)")
    fmt = sniff_format(data)
    taken = sorted(f for f, k in FORMAT_KINDS.items() if k == kind)
    if fmt is None:
        raise MediaError(
            part_path,
            UNSUPPORTED_CONTENT_TYPE,
            f"the {part_type!r} part's data is not a supported {kind} format ({', '.join(taken)})",
        )
    if FORMAT_KINDS[fmt] != kind:
        raise MediaError(
            part_path,
            UNSUPPORTED_CONTENT_TYPE,
            f"the {part_type!r} part holds {FORMAT_KINDS[fmt]} data ({fmt}), not {kind}; "
            f"a {part_type!r} part takes {', '.join(taken)}",
        )
    return fmt
