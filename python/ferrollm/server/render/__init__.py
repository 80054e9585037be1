"""One renderer per API behind `Renderer`: the chat and completions handlers build their
chunks and responses through it and never branch on the API (``openai``: the ``/v1`` routes
with MindIE's extensions; ``databricks``: the Foundation Model API's tasks). MindIE's own
``generate`` route renders its frames in ``routes/mindie.py``; every renderer reads a
sequence's ending as an `Outcome`."""

from ferrollm.server.render.base import Renderer
from ferrollm.server.render.databricks import DatabricksRenderer
from ferrollm.server.render.openai import OpenAIRenderer
from ferrollm.server.render.outcome import Outcome, first_abnormal

__all__ = ["DatabricksRenderer", "OpenAIRenderer", "Outcome", "Renderer", "first_abnormal"]
