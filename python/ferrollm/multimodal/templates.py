"""How a chat template wants a message's media: as typed parts, or as placeholders in text.

Hugging Face's multimodal templates read a message's content as a list of parts and write
their own marker for each media part: SmolVLM's tests a part's ``type`` (``{"type":
"image"}``), Qwen2-Audio's tests for a media key (``'audio' in content``) and writes
"Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>". A text template prints content as a string,
so there each media part stands as the processor's placeholder inside the text. The offline
API and the server both render through here, so a conversation renders alike on both.
"""

from __future__ import annotations

import re
from typing import Any

from ferrollm.multimodal.inputs import MediaKind

#: A template testing a part's type: ``part['type']``, ``part["type"]`` or ``part.type``.
_TESTS_TYPE = ("['type']", '["type"]', ".type")
#: A template testing for a media key in a part: ``'audio' in content``.
_TESTS_KEY = re.compile(r"""['"](image|video|audio)(_url)?['"]\s+in\s+\w+""")
_KINDS = ("'image'", '"image"', "'video'", '"video"', "'audio'", '"audio"')


def reads_parts(template: str | None) -> bool:
    """Whether ``template`` reads content as typed parts and writes media parts itself."""
    if template is None:
        return False
    if _TESTS_KEY.search(template):
        return True
    return any(t in template for t in _TESTS_TYPE) and any(k in template for k in _KINDS)


def template_part(kind: MediaKind) -> dict[str, Any]:
    """A media part as such templates test it: by its ``type`` or by a key named after its
    kind (the value is not read; the media itself goes to the processor)."""
    return {"type": kind, kind: kind}
