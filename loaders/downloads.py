"""Models on first use: the known releases, fetched from the Hugging Face hub into the
pack's model folder.

:data:`RELEASES` names each release the loader offers (its hub repository, the files
the loader needs of it, and what it is).  :func:`download` fetches one with
huggingface_hub into ``<root>/<name>.partial/`` (huggingface_hub resumes an
interrupted file from where it stopped), checks it (every expected file present,
every safetensors header readable, every torch archive a whole zip), and only then
renames it to ``<root>/<name>/``: a folder under the release's own name is always
complete, and a later run never takes half a download for a model.  What goes wrong
is one :class:`DownloadError` naming the release and what to do: no network, a gated
repository (a token), a full disk, a file that arrived damaged.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import pathlib
import shutil
import zipfile
from dataclasses import dataclass
from typing import Callable

#: the loader's label for a release that is not on disk yet
PREFIX = "download: "


class DownloadError(RuntimeError):
    """One clear line: which release, what went wrong, what to do."""


@dataclass(frozen=True)
class Source:
    repo: str  # the hub repository
    files: tuple[str, ...]  # file names or patterns (fnmatch) the loader reads


@dataclass(frozen=True)
class Release:
    name: str  # the folder it lands in, under the pack's model folder
    family: str
    what: str
    sources: tuple[Source, ...]
    gated: bool = False  # the hub asks for a token (and the licence accepted on the repository's page)


_HF = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken")  # a transformers folder
_HEAD = ("config.json", "pytorch_model.bin")  # a LANTERN draft head
_VQGAN = Source("GAIR/Anole-7b-v0.1", ("tokenizer/vqgan.yaml", "tokenizer/vqgan.ckpt"))  # Meta's VQGAN
_COSMOS = Source("nvidia/Cosmos-1.0-Tokenizer-DV8x16x16", ("decoder.jit",))  # SimpleAR's image tokenizer

RELEASES = {r.name: r for r in (
    Release("LlamaGen-c2i-B-256", "llamagen", "LlamaGen-B class-conditional, 256 px, with its VQ tokenizer",
            (Source("FoundationVision/LlamaGen", ("c2i_B_256.pt", "vq_ds16_c2i.pt")),)),
    Release("LlamaGen-c2i-L-384", "llamagen", "LlamaGen-L class-conditional, 384 px, with its VQ tokenizer",
            (Source("FoundationVision/LlamaGen", ("c2i_L_384.pt", "vq_ds16_c2i.pt")),)),
    Release("LlamaGen-c2i-XL-384", "llamagen", "LlamaGen-XL class-conditional, 384 px, with its VQ tokenizer",
            (Source("FoundationVision/LlamaGen", ("c2i_XL_384.pt", "vq_ds16_c2i.pt")),)),
    Release("LlamaGen-t2i-XL-256", "llamagen", "LlamaGen-XL text-to-image, 256 px (stage I, the base of LANTERN's "
            "drafter), with its VQ tokenizer (needs flan-t5-xl as its text encoder)",
            (Source("peizesun/llamagen_t2i", ("t2i_XL_stage1_256.pt", "vq_ds16_t2i.pt")),)),
    Release("LlamaGen-t2i-XL-512", "llamagen", "LlamaGen-XL text-to-image, 512 px, with its VQ tokenizer "
            "(needs flan-t5-xl as its text encoder)",
            (Source("peizesun/llamagen_t2i", ("t2i_XL_stage2_512.pt", "vq_ds16_t2i.pt")),)),
    Release("flan-t5-xl", "t5", "the text encoder of LlamaGen text-to-image",
            (Source("google/flan-t5-xl", ("*.json", "spiece.model", "*.safetensors")),)),
    Release("Janus-Pro-1B", "janus", "Janus-Pro 1B, 384 px (decoder included)",
            (Source("deepseek-community/Janus-Pro-1B", _HF),)),
    Release("Janus-Pro-7B", "janus", "Janus-Pro 7B, 384 px (decoder included)",
            (Source("deepseek-community/Janus-Pro-7B", _HF),)),
    Release("Lumina-mGPT-7B-512", "lumina", "Lumina-mGPT 7B, 512 px, with Meta's VQGAN",
            (Source("Alpha-VLLM/Lumina-mGPT-7B-512", _HF), _VQGAN)),
    Release("Lumina-mGPT-7B-768", "lumina", "Lumina-mGPT 7B, 768 px, with Meta's VQGAN",
            (Source("Alpha-VLLM/Lumina-mGPT-7B-768", _HF), _VQGAN)),
    Release("Anole-7b-v0.1", "anole", "Anole 7B (Meta's layout), with Meta's VQGAN",
            (Source("GAIR/Anole-7b-v0.1", ("models/7b/*", "tokenizer/*")),)),
    Release("Emu3-Gen-hf", "emu3", "Emu3-Gen 8B, 720 px (decoder included)",
            (Source("Emu3-community/Emu3-Gen-hf", _HF),)),
    Release("Liquid_V1_7B", "liquid", "Liquid 7B (on Gemma-7B), 512 px, with Meta's VQGAN",
            (Source("Junfeng5/Liquid_V1_7B", _HF), _VQGAN)),
    Release("Lumina-mGPT-2.0", "lumina2", "Lumina-mGPT 2.0 7B, 768 px, with SBER-MoVQGAN 270M",
            (Source("Alpha-VLLM/Lumina-mGPT-2.0", _HF), Source("ai-forever/MoVQGAN", ("movqgan_270M.ckpt",)))),
    Release("SimpleAR-0.5B-RL", "simplear", "SimpleAR 0.5B (on Qwen2.5, RL-tuned), 1024 px, with NVIDIA's Cosmos "
            "DV8x16x16 tokenizer", (Source("Daniel0724/SimpleAR-0.5B-RL", _HF), _COSMOS)),
    Release("SimpleAR-1.5B-RL", "simplear", "SimpleAR 1.5B (on Qwen2.5, RL-tuned), 1024 px, with NVIDIA's Cosmos "
            "DV8x16x16 tokenizer", (Source("Daniel0724/SimpleAR-1.5B-RL", _HF), _COSMOS)),
    # LANTERN's trained draft heads (jadohu/LANTERN's README: config.json and pytorch_model.bin each)
    Release("LANTERN-drafter-LlamaGen-t2i-XL-256", "drafter",
            "LANTERN's draft head for LlamaGen-XL text-to-image stage I, 256 px (LlamaGen-t2i-XL-256)",
            (Source("jadohu/llamagen_drafter", _HEAD),)),
    Release("LANTERN-drafter-LlamaGen-t2i-XL-512", "drafter",
            "LANTERN's draft head for LlamaGen-XL text-to-image stage II, 512 px (LlamaGen-t2i-XL-512)",
            (Source("jadohu/llamagen2_drafter", _HEAD),)),
    Release("LANTERN-drafter-Anole-7b", "drafter", "LANTERN's draft head for Anole 7B (Anole-7b-v0.1)",
            (Source("jadohu/anole_drafter", _HEAD),)),
)}


def present(root: pathlib.Path) -> set[str]:
    """The releases already complete under ``root``."""
    return {name for name in RELEASES if (pathlib.Path(root) / name).is_dir()}


def kind_of(release: Release) -> str:
    """``model``, ``text encoder`` or ``drafter``: which loader offers the release."""
    return {"t5": "text encoder", "drafter": "drafter"}.get(release.family, "model")


def missing(root: pathlib.Path, kind: str = "model") -> list[str]:
    """The labels of the releases of ``kind`` (:func:`kind_of`) not on disk under ``root``,
    as the loader that offers them lists them."""
    have = present(root)
    return [PREFIX + name for name, r in RELEASES.items() if name not in have and kind_of(r) == kind]


def release_of(label: str) -> Release | None:
    """The release a loader label (``download: NAME``) or a plain name stands for."""
    return RELEASES.get(label.removeprefix(PREFIX))


def download(name: str, root, endpoint: str | None = None, token: str | None = None,
             progress: Callable[[int, int], None] | None = None) -> pathlib.Path:
    """Fetch release ``name`` into ``root / name`` (see the module docstring) and return that
    folder; a complete one already there is returned as it is.  ``progress(done, total)``
    hears bytes as they arrive; ``endpoint``: another hub (default: huggingface.co, or
    ``HF_ENDPOINT``)."""
    release = release_of(name)
    if release is None:
        raise DownloadError(f"model {name!r} is not a known release; known: {', '.join(RELEASES)}")
    root = pathlib.Path(root)
    final = root / release.name
    if final.is_dir():
        return final
    partial = root / f"{release.name}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    try:
        for source in release.sources:
            _fetch(release, source, partial, endpoint, token, progress)
        verify(release, partial)
    except DownloadError:
        raise
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise DownloadError(f"{release.name}: the disk holding {root} is full; free space and run again "
                                "(what arrived is kept and resumes)") from None
        raise
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # huggingface_hub's resume bookkeeping
    partial.rename(final)
    return final


def _fetch(release: Release, source: Source, folder: pathlib.Path, endpoint, token, progress) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub import errors as hub

    try:
        snapshot_download(source.repo, allow_patterns=list(source.files), local_dir=str(folder),
                          endpoint=endpoint, token=token, max_workers=2, tqdm_class=_bytes_reporter(progress))
    except hub.GatedRepoError:
        raise DownloadError(f"{release.name}: {source.repo} is gated: accept its licence on its page on the hub, "
                            "then log in (`hf auth login`) or set HF_TOKEN, and run again") from None
    except hub.RepositoryNotFoundError:
        raise DownloadError(f"{release.name}: the hub has no repository {source.repo} (or it needs a token: "
                            "set HF_TOKEN)") from None
    except (hub.LocalEntryNotFoundError, hub.OfflineModeIsEnabled, ConnectionError) as err:
        raise DownloadError(f"{release.name}: cannot reach the hub ({_first_line(err)}): no network? Run again "
                            "when online (what arrived is kept and resumes), or download "
                            f"{source.repo} by hand into {folder.parent / release.name}") from None
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise
        if isinstance(err, hub.HfHubHTTPError) or "Consistency check failed" in str(err):
            raise DownloadError(f"{release.name}: {source.repo}: {_first_line(err)}; run again to resume") from None
        raise
    except Exception as err:  # httpx's connection errors are not OSErrors
        if type(err).__module__.startswith(("httpx", "httpcore")):
            raise DownloadError(f"{release.name}: cannot reach the hub ({_first_line(err)}): no network? Run "
                                "again when online (what arrived is kept and resumes)") from None
        raise


def verify(release: Release, folder: pathlib.Path) -> None:
    """Every file the release names is there, and the weights are readable; else a
    :class:`DownloadError` naming the file (the download stays ``.partial``)."""
    from ..formats.checkpoints import peek

    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*")
             if p.is_file() and not p.relative_to(folder).as_posix().startswith(".cache/")]
    for source in release.sources:
        for pattern in source.files:
            if not any(fnmatch.fnmatch(f, pattern) for f in files):
                raise DownloadError(f"{release.name}: {source.repo} gave no file {pattern!r}; run again, or check "
                                    "the repository on the hub")
    for name in files:
        path = folder / name
        try:
            if name.endswith(".safetensors"):
                peek(path)
            elif name.endswith((".pt", ".pth", ".ckpt", ".bin", ".jit")) and not zipfile.is_zipfile(path):
                raise ValueError("not a whole torch archive")
        except Exception as err:
            path.unlink(missing_ok=True)  # fetched again on the next run
            raise DownloadError(f"{release.name}: {name} arrived damaged ({_first_line(err)}); it was removed: "
                                "run again to fetch it again") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _bytes_reporter(progress):
    """A tqdm class for huggingface_hub that hands its byte count (the bytes that came over
    the network, across files) to ``progress(done, total)``."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    if progress is None:
        return None

    class Reporter(hub_tqdm):
        def __init__(self, *args, **kwargs):
            self._reports = kwargs.get("unit") == "B" and str(kwargs.get("desc", "")).startswith("Downloading")
            self._done = int(kwargs.get("initial") or 0)
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if self._reports and n:
                self._done += int(n)
                progress(self._done, int(self.total or 0))
            return super().update(n)

    return Reporter


def default_root() -> pathlib.Path:
    """Where the command line puts downloads: ComfyUI's ``models/spec_ar`` when run inside
    a ComfyUI checkout (``SPEC_AR_MODELS`` overrides), else ``./models/spec_ar``."""
    if os.environ.get("SPEC_AR_MODELS"):
        return pathlib.Path(os.environ["SPEC_AR_MODELS"])
    here = pathlib.Path(__file__).resolve().parents[1]
    if here.parent.name == "custom_nodes":
        return here.parent.parent / "models" / "spec_ar"
    return pathlib.Path("models") / "spec_ar"
