"""Server options: `ServerConfig` (the HTTP server's: address, names, limits, keys, TLS,
deadlines, overload, drain), and the one way options become both configs (`split_options`, from
the CLI's flags and ``--config`` file). The engine's options are `ferrollm.config`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ferrollm.config import (
    TEXT_OFFSET_MODES,
    TOOL_CALL_PARSERS,
    EngineConfig,
    EngineConfigError,
    one_of,
    parse_bytes,
    positive_int,
)
from ferrollm.media.options import MediaPolicy
from ferrollm.reasoning import REASONING_PARSERS

#: The default limit on a request body (docs/api/common.md#request-bodies: 413 past it).
DEFAULT_MAX_BODY_BYTES = 16 * 1024**2
#: Paths that need no API key: health, metrics and the OpenAPI document.
DEFAULT_PUBLIC_PATHS = (
    "/health",
    "/v2/health/live",
    "/v2/health/ready",
    "/metrics",
    "/openapi.json",
)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP server options (CLI ``--served-model-name`` is ``served_model_name``), checked on
    construction. Raises EngineConfigError naming the option."""

    host: str = "127.0.0.1"
    port: int = 8000
    #: The name clients put in ``model`` and the MindIE path (MindIE's ``modelName``); None =
    #: the model file's or directory's name.
    served_model_name: str | None = None
    #: Prompt tokens at most (MindIE's ``maxInputTokenLen``); None = ``max_model_len - 1``.
    max_input_tokens: int | None = None
    #: Generated tokens per request at most, and the ``/v1`` default ``max_tokens`` (MindIE's
    #: ``maxIterTimes``); None = ``max_model_len``.
    max_iter_times: int | None = None
    #: MindIE ``fullTextEnabled``: streamed generate and chat text is cumulative.
    full_text: bool = False
    #: Largest request body: bytes or a size like "16MiB"; larger ones get 413 unread.
    max_body_bytes: int | str = DEFAULT_MAX_BODY_BYTES
    #: Whether a request's ``model`` must equal the served name (404 otherwise,
    #: docs/decisions.md#the-model-name).
    strict_model_name: bool = True
    #: Completions ``text_offset``: "openai" (each choice counts from 0) or "mindie" (choice k
    #: counts on from where choice k-1's text ended, as MindIE's samples do,
    #: docs/decisions.md#text-offsets-across-choices; whole responses only: a stream interleaves its
    #: choices).
    text_offset_mode: str = "openai"
    #: API keys a client must send as ``Authorization: Bearer <key>`` (with those of
    #: ``api_key_file`` and ``FERROLLM_API_KEYS``); none at all = no authentication.
    api_keys: tuple[str, ...] = ()
    #: A file of API keys, one a line (blank lines and ``#`` comments skipped).
    api_key_file: str | None = None
    #: Paths served without a key while keys are configured.
    public_paths: tuple[str, ...] = DEFAULT_PUBLIC_PATHS
    #: Requests one API key may have in flight at once; more get 429.
    max_concurrent_per_key: int = 64
    #: Seconds a request may take, queue time included, when it names no ``timeout`` of its
    #: own; None = no server deadline.
    request_timeout: float | None = None
    #: Admission: requests waiting for their first step, and their prompt tokens, at most;
    #: past either, new requests get 503 with ``Retry-After``.
    max_waiting_requests: int = 256
    max_waiting_tokens: int = 262144
    #: TLS: the server's certificate and key (PEM); ``ssl_ca_certs`` turns on client
    #: certificate verification against those CAs (mutual TLS).
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    #: Seconds in-flight requests get to finish after SIGTERM before the process exits.
    drain_timeout: float = 30.0
    #: How tool calls are written and parsed: a family, "auto" (detected from the chat
    #: template) or "none" (requests with tools are refused unless ``tool_choice`` is "none").
    tool_call_parser: str = "auto"
    #: How a thinking model's ``<think>`` text is split into ``reasoning_content`` on
    #: ``/v1/chat/completions``: "deepseek_r1", "qwen3", "auto" (from the chat template) or
    #: "none" (ferrollm.reasoning).
    reasoning_parser: str = "auto"
    #: ``Host`` header values (the name, without the port; case-insensitive) the server
    #: answers to; any other gets 400. Empty (the default) = any host (no DNS-rebinding
    #: protection: put the names the server is reached by here when that matters).
    allowed_hosts: tuple[str, ...] = ()
    #: Seconds a client may take to send its whole request body after its headers; a client
    #: that trickles it slower gets 408 and the connection is closed.
    body_read_timeout: float = 30.0
    #: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` answer (404 otherwise,
    #: as vLLM without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); the directories they read must
    #: lie under ``allowed_lora_path`` (symlinks and ``..`` resolved first).
    allow_runtime_lora_updating: bool = False
    allowed_lora_path: str | None = None
    #: Media parts (docs/api/common.md#media-parts) may name server-local files only under
    #: this directory (vLLM's ``--allowed-local-media-path``); None = no local files.
    allowed_local_media_path: str | None = None
    #: The only hosts http(s) media is fetched from (vLLM's ``--allowed-media-domains``; a
    #: comma-separated string or a list); empty = any host with public addresses only.
    allowed_media_domains: tuple[str, ...] = ()
    #: Serve the web playground at ``/`` (docs/serving.md#the-playground); ``--no-playground``
    #: turns it off.
    playground: bool = True

    def __post_init__(self) -> None:
        check_reliability_options(self)
        if not isinstance(self.host, str) or not self.host:
            raise EngineConfigError("host", f"`host` must be a non-empty string; got {self.host!r}")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise EngineConfigError(
                "port", f"`port` must be an integer in [0, 65535]; got {port!r}"
            )
        name = self.served_model_name
        if name is not None and (not isinstance(name, str) or not name):
            raise EngineConfigError(
                "served_model_name", f"`served_model_name` must be a non-empty string; got {name!r}"
            )
        for option in ("max_input_tokens", "max_iter_times"):
            if getattr(self, option) is not None:
                positive_int(option, getattr(self, option))
        one_of("tool_call_parser", self.tool_call_parser, TOOL_CALL_PARSERS)
        one_of("reasoning_parser", self.reasoning_parser, REASONING_PARSERS)
        one_of("text_offset_mode", self.text_offset_mode, TEXT_OFFSET_MODES)
        if self.allow_runtime_lora_updating and not self.allowed_lora_path:
            raise EngineConfigError(
                "allowed_lora_path",
                "`allow_runtime_lora_updating` needs `allowed_lora_path`: the directory that "
                "adapters loaded at run time must lie under",
            )
        check_media_options(self)
        for option in (
            "full_text",
            "strict_model_name",
            "allow_runtime_lora_updating",
            "playground",
        ):
            if not isinstance(getattr(self, option), bool):
                raise EngineConfigError(
                    option, f"`{option}` must be true or false; got {getattr(self, option)!r}"
                )
        try:
            size = parse_bytes(self.max_body_bytes)
        except EngineConfigError:
            raise EngineConfigError(
                "max_body_bytes",
                "`max_body_bytes` must be a positive number of bytes or a size like '16MiB'; "
                f"got {self.max_body_bytes!r}",
            ) from None
        object.__setattr__(self, "max_body_bytes", size)

    @property
    def max_body_size(self) -> int:
        """``max_body_bytes`` in bytes."""
        return int(self.max_body_bytes)

    def media_policy(self) -> MediaPolicy:
        """Where media parts may come from, by ``allowed_local_media_path`` and
        ``allowed_media_domains`` (checked on construction, so this does not raise unless the
        directory has gone since)."""
        return MediaPolicy.create(self.allowed_local_media_path, self.allowed_media_domains)


def split_options(options: Mapping[str, Any]) -> tuple[EngineConfig, ServerConfig]:
    """The engine and server configs of one mapping of options (a ``--config`` file mirrors
    the CLI flags: ``max-num-seqs`` or ``max_num_seqs``, ``port``, ``full-text`` ...)."""
    engine_names = {f.name for f in fields(EngineConfig)}
    server_names = {f.name for f in fields(ServerConfig)}
    engine: dict[str, Any] = {}
    server: dict[str, Any] = {}
    for key, value in options.items():
        name = str(key).replace("-", "_")
        if name in engine_names:
            engine[name] = value
        elif name in server_names:
            server[name] = value
        else:
            valid = ", ".join(sorted(engine_names | server_names))
            raise EngineConfigError(name, f"unknown option `{key}`; valid: {valid}")
    return EngineConfig(**engine), ServerConfig(**server)


def check_media_options(config: ServerConfig) -> None:
    """Check the media sources: the local root must be an absolute, existing directory and
    the domains host names (a flag's comma-separated string becomes a tuple); raises
    EngineConfigError naming the option, so a bad root stops the server at start-up."""
    try:
        policy = MediaPolicy.create(config.allowed_local_media_path, config.allowed_media_domains)
    except EngineConfigError as e:
        flag = "--" + e.field.replace("_", "-")
        raise EngineConfigError(e.field, f"{e} (the {flag} flag)") from None
    object.__setattr__(config, "allowed_media_domains", tuple(sorted(policy.allowed_media_domains)))


def check_reliability_options(config: ServerConfig) -> None:
    """Check (and normalise: lists -> tuples) the keys, deadline, admission, TLS and drain
    options of ``config``; raises EngineConfigError naming the option."""
    for option in ("api_keys", "public_paths", "allowed_hosts"):
        value = getattr(config, option)
        if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
            raise EngineConfigError(
                option, f"`{option}` must be a list of non-empty strings; got {value!r}"
            )
        object.__setattr__(config, option, tuple(value))
    for option in ("max_concurrent_per_key", "max_waiting_requests", "max_waiting_tokens"):
        positive_int(option, getattr(config, option))
    object.__setattr__(config, "allowed_hosts", tuple(h.lower() for h in config.allowed_hosts))
    for option in ("request_timeout", "drain_timeout", "body_read_timeout"):
        value = getattr(config, option)
        if value is None and option == "request_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise EngineConfigError(option, f"`{option}` must be a number > 0; got {value!r}")
    if (config.ssl_certfile is None) != (config.ssl_keyfile is None):
        raise EngineConfigError(
            "ssl_certfile", "`ssl_certfile` and `ssl_keyfile` must be given together"
        )
    if config.ssl_ca_certs is not None and config.ssl_certfile is None:
        raise EngineConfigError(
            "ssl_ca_certs", "`ssl_ca_certs` (client verification) needs `ssl_certfile`"
        )
    for option in ("api_key_file", "ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(config, option)
        if path is not None and not os.path.isfile(path):
            raise EngineConfigError(option, f"`{option}` {path!r} is not a readable file")
