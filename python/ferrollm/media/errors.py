"""The one error the media layer raises, carrying what an API error body needs.

A media part that cannot be used is the client's fault (a bad URL, a file that is not an
image, a host the server may not reach), so every `MediaError` is an HTTP 400. Oversized
media is a 400 too, not a 413: 413 speaks of the request body, and a fetched URL or a local
file is not part of it; OpenAI-style servers answer oversized media with 400 as well. The
``param`` is the part's location as the client wrote it (``messages[0].content[1].image_url``)
and ``code`` a stable tag, so the server's error mapping can copy both into the body.
"""

from __future__ import annotations

#: The part's media is unreadable: corrupt, truncated, empty or not the format it claims.
INVALID_MEDIA = "invalid_media"
#: Over a byte, pixel, frame or duration limit.
MEDIA_TOO_LARGE = "media_too_large"
#: The URL could not be fetched: connection refused, timeout, HTTP error, too many redirects.
MEDIA_FETCH_FAILED = "media_fetch_failed"
#: A server-local path outside the allowed root, or local paths not enabled.
MEDIA_PATH_NOT_ALLOWED = "media_path_not_allowed"
#: A URL the address policy refuses: a private address, a host not on the list, a scheme
#: downgrade or a scheme other than http(s) in a redirect.
MEDIA_URL_NOT_ALLOWED = "media_url_not_allowed"
#: A format the part's kind does not take (a PNG in ``audio_url``) or an unknown part type.
UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"
#: Part shape errors, named as the request validator names them.
MISSING = "missing"
WRONG_TYPE = "wrong_type"
EMPTY = "empty"
TOO_MANY = "too_many"


class MediaError(ValueError):
    """A media part that cannot be used: ``param`` names the part, ``code`` the rule broken.

    ``status`` is always 400 (see the module docstring for why not 413 for size). A
    ValueError, so that an error mapping that does not know this class still answers 400
    rather than 500.
    """

    status = 400

    def __init__(self, param: str, code: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.code = code
        self.message = f"{param}: {message}"


class MediaDependencyError(ImportError):
    """Pillow or PyAV is missing: media decoding needs ``pip install ferrollm[media]``."""
