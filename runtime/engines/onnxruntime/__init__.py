"""The ONNX Runtime engine: runs an exported artifact on an execution provider chosen by device."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from vllm_sr_runtime.cpu_threads import cpu_threads
from vllm_sr_runtime.engines.onnxruntime.providers import provider_start_error, select_provider
from vllm_sr_runtime.errors import ArtifactError, UnsupportedDeviceError
from vllm_sr_runtime.interrupts import Interruptible

log = logging.getLogger(__name__)


def session_options(device_kind: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = cpu_threads()
    options.log_severity_level = 3
    if device_kind == "cpu":
        # The memory pattern plans one block per input shape seen twice; served prompts vary in length, so the
        # arena keeps growing with each repeated shape (measured: a 8k-token Decision 2.0 int8 session at 9.0 GB
        # after six requests of three lengths, 4.2 GB without it, forwards no slower). Other providers keep ORT's
        # default (not measured on them).
        options.enable_mem_pattern = False
    else:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return options


class OrtEngine(Interruptible):
    name = "onnxruntime"
    golden: dict | None = None

    def __init__(self, session, output_name: str, provider: str, device_kind: str = "cpu", device_index: int | None = None):
        self.session = session
        self.output_name = output_name
        self.provider = provider
        self.device_kind, self.device_index = device_kind, device_index
        self.input_names = [i.name for i in session.get_inputs()]
        # On a GPU: inputs in kept device buffers, the output bound on the device (CUDA) and copied back alone.
        self.buffers = None
        if device_kind == "cuda":
            from vllm_sr_runtime.engines.onnxruntime.io_binding import DeviceBuffers

            self.buffers = DeviceBuffers("cuda", device_index or 0)
        self.shared_session = None  # the shared_context graph, when attached
        self.media = None  # the vision and media text graphs (MediaGraphs), when attached
        self.optimized_cache: Path | None = None
        # "hit" (opened the saved optimized graph), "stored", "unavailable" (the cache could not take it), None
        self.optimized_cache_use: str | None = None
        self.attention_query_block: int | None = None  # CPU: full attention runs over blocks of this many queries
        self.graph_files: set[Path] = set()  # the artifact's graphs its sessions opened (weight_bytes)

    @classmethod
    def from_file(
        cls,
        model_path: Path,
        *,
        device_kind: str = "cpu",
        device_index: int | None = None,
        output_name: str,
        optimized_cache: Path | None = None,
        buckets: dict | None = None,
        attention_query_block: int | None | Literal["default"] = "default",
    ) -> "OrtEngine":
        """`buckets` (the manifest's, for graphs with static sequence lengths): one graph per length next to
        `model_path`; on a GPU every graph is opened (compiled) now, on CPU each on first use.
        `attention_query_block`: on CPU, full attention runs over blocks of that many queries (attention_blocks;
        None: as exported; "default": attention_blocks.ATTENTION_QUERY_BLOCK)."""
        if attention_query_block == "default":
            from vllm_sr_runtime.engines.onnxruntime import attention_blocks

            attention_query_block = attention_blocks.ATTENTION_QUERY_BLOCK
        block = attention_query_block if device_kind == "cpu" else None
        opened: set[Path] = set()

        def open_graph(path: Path):
            opened.add(path)
            return open_session(path, device_kind, device_index, optimized_cache, block)

        if buckets:
            from vllm_sr_runtime.engines.onnxruntime.static_lengths import StaticLengthSessions

            session = StaticLengthSessions(model_path.parent, buckets, lambda path: open_graph(path)[0])
            if device_kind != "cpu":
                session.open_all()
            use = None
        else:
            session, use = open_graph(model_path)
        engine = cls(session, output_name, session.get_providers()[0], device_kind, device_index)
        engine.graph_files = opened  # a static-length graph opened later on CPU joins it
        engine.optimized_cache, engine.optimized_cache_use = optimized_cache, use
        engine.attention_query_block = block
        return engine

    def attach_shared(self, model_path: Path) -> None:
        """Open the artifact's shared_context graph next to the main one (same provider and options)."""
        self.shared_session, _ = open_session(model_path, self.device_kind, self.device_index, self.optimized_cache, self.attention_query_block)
        self.graph_files.add(model_path)

    def attach_media(self, vision_path: Path, text_path: Path, layout, modalities: tuple[tuple[str, str, str], ...]) -> None:
        """Open the artifact's vision graph and media text graph (requests with images/videos); `modalities`
        names each modality's (pixel input, grid input, feature input)."""
        from vllm_sr_runtime.engines.onnxruntime.media import MediaGraphs

        vision, text = (open_session(path, self.device_kind, self.device_index, self.optimized_cache, self.attention_query_block)[0] for path in (vision_path, text_path))
        self.graph_files |= {vision_path, text_path}
        self.media = MediaGraphs(vision, text, layout, self.output_name, modalities)

    @property
    def reads_media(self) -> bool:
        return self.media is not None

    def weight_bytes(self) -> int:
        """The bytes of the graphs its sessions opened and of their weight files (each file once: the shared and media
        graphs read the main graph's weights), what the sessions hold as initializers."""
        files = set(self.graph_files) | {path.with_name(path.name + ".data") for path in self.graph_files}
        return sum(path.stat().st_size for path in files if path.is_file())

    def _stoppable(self, run: Callable[[Any], np.ndarray]) -> np.ndarray:
        """run(run_options) under this pass's interrupt: its session runs read a RunOptions whose terminate flag the
        interrupt raises."""
        interrupt = self.interrupt
        if interrupt is None:
            return run(None)
        import onnxruntime as ort

        options = ort.RunOptions()
        options.log_severity_level = 4  # a terminated run logs an error per node it unwinds; Interrupted says it once
        with interrupt.calls(lambda: setattr(options, "terminate", True)):
            try:
                return run(options)
            except Exception:
                interrupt.check()  # once set, ORT's own Fail ("terminate flag being set") means Interrupted
                raise

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self._stoppable(lambda options: _run(self.session, self.output_name, inputs, self.buffers, options))

    def forward_media(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if self.media is None:
            raise ArtifactError("this artifact has no vision graph; re-export it from a package with a vision tower")
        return self._stoppable(lambda options: self.media.forward(inputs, options))

    def forward_shared(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if self.shared_session is None:
            raise ArtifactError("this artifact has no shared_context graph; re-export it with --shared-context")
        return self._stoppable(lambda options: _run(self.shared_session, self.output_name, inputs, self.buffers, options))


def open_session(
    model_path: Path, device_kind: str, device_index: int | None, optimized_cache: Path | None = None, attention_query_block: int | None = None
):
    """(session, cache use). With `optimized_cache` (CPU only: other providers' optimized graphs embed
    device-specific nodes), the first open saves ORT's optimized graph there and later opens load it; where it
    cannot be stored (a read-only or full disk), the session opens without it ("unavailable", logged).
    `attention_query_block`: full attention over blocks of that many queries (attention_blocks), where the graph
    has Attention nodes it applies to."""
    import onnxruntime as ort

    from vllm_sr_runtime.engines.onnxruntime.attention_blocks import FORM as BLOCKS_FORM
    from vllm_sr_runtime.engines.onnxruntime.optimized_cache import cached_model, entry_identity, key_of, open_and_save

    spec = select_provider(device_kind, ort.get_available_providers())
    provider, options_for_provider = spec.name, spec.options(device_index)

    def open_with(options, path: Path | None = None):
        """`path`: a saved optimized graph; None: the artifact's graph (rewritten here, so a cache hit never pays for it)."""
        if path is None:
            source, config = graph_source(model_path, attention_query_block)
            for key, value in config.items():
                options.add_session_config_entry(key, value)
        else:
            source = str(path)
        try:
            session = ort.InferenceSession(source, sess_options=options, providers=[(provider, options_for_provider)])
        except Exception as exc:
            if device_kind != "cpu" and _looks_like_provider_failure(str(exc)):
                raise provider_start_error(device_kind, [], str(exc).splitlines()[0][:300], provider=spec) from None
            raise
        if session.get_providers()[0] != provider:  # ORT logs why and falls back to CPU: refuse that
            raise provider_start_error(device_kind, session.get_providers(), provider=spec)
        return session

    try:
        if optimized_cache is None or device_kind != "cpu":
            return open_with(session_options(device_kind)), None
        identity = entry_identity(model_path, provider, f"attention_query_block={attention_query_block},{BLOCKS_FORM}" if attention_query_block else "")
        key = key_of(identity)
        cached = cached_model(optimized_cache, key)
        if cached is not None:
            options = session_options(device_kind)
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized already
            try:
                return open_with(options, cached), "hit"
            except Exception:  # a damaged entry: drop it and optimize again
                import shutil

                shutil.rmtree(cached.parent, ignore_errors=True)
        try:
            return open_and_save(open_with, session_options(device_kind), optimized_cache, key, identity), "stored"
        except Exception as exc:  # the cache's disk full, read-only or not a directory: serve without it
            session = open_with(session_options(device_kind))  # a graph that cannot open at all raises here
            log.warning("ONNX Runtime's optimized graph of %s could not be stored in %s (%s): opened without the cache", model_path, optimized_cache, str(exc).splitlines()[0][:300])
            return session, "unavailable"
    except UnsupportedDeviceError:
        raise
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        raise ArtifactError(f"ONNX Runtime cannot open {model_path} on {provider}: {exc}") from None


def graph_source(model_path: Path, attention_query_block: int | None) -> tuple[str | bytes, dict[str, str]]:
    """What ORT opens and the session config that needs: the file as exported, or (where the graph has full
    attention the block applies to) the rewritten graph in memory, whose weights are still read beside the file."""
    import onnx

    from vllm_sr_runtime.engines.onnxruntime.attention_blocks import split_attention_queries

    if not attention_query_block:
        return str(model_path), {}
    model = onnx.load(str(model_path), load_external_data=False)
    if not split_attention_queries(model, attention_query_block):
        return str(model_path), {}
    return model.SerializeToString(), {"session.model_external_initializers_file_folder_path": str(Path(model_path).parent)}


def _looks_like_provider_failure(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in ("cuda", "cudnn", "cublas", "hip", "migraphx", "rocm", "libcu", "provider"))


def _run(session, output_name: str, inputs: dict[str, np.ndarray], buffers=None, run_options=None) -> np.ndarray:
    feed = {value.name: np.ascontiguousarray(inputs[value.name]) for value in session.get_inputs()}
    resolve = getattr(session, "resolve", None)
    if resolve is not None:  # static-length graphs: the padded rows and the graph that takes them
        session, feed = resolve(feed)
    if buffers is not None:
        return buffers.run(session, output_name, feed, run_options).astype(np.float32, copy=False)
    return session.run([output_name], feed, run_options)[0].astype(np.float32, copy=False)
