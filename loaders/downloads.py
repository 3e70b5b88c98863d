"""Models on first use: the known releases, fetched from the Hugging Face hub into the
pack's model folder.

:data:`RELEASES` names each release the loader offers: its hub repositories and, of each, the
files its loader opens (``files``: every one must be there), the files it reads when they are
there (``optional``: fetched when the repository has them) and its weights: those of a
transformers folder at the repository's root (``weights``: ``model.safetensors``, or the index and
every shard the index names), and those of the folders inside it where a diffusers release's
components keep theirs (``weights_in``: in each, transformers' names or diffusers'
``diffusion_pytorch_model.safetensors`` and its index, the shards an index names beside it).
Weights are safetensors only: pickled ones (``.bin``, ``.pt`` ...) beside them are never taken.
Nothing else of a repository is fetched.  A release may also take files the hub does not carry
from the authors' git repository (:class:`Pinned`: Emu3.5's text tokenizer), each pinned in this
module to one commit, its size and its git blob hash.

:func:`download` lists each repository at one commit (the hub's tree API: every file's size and
the hash the hub keeps of it) and checks that everything required is there before fetching
anything large.  The files then come one at a time, in the calling thread (one Ctrl-C stops the
download at once), into ``<root>/<name>.partial/``: each streams into ``FILE.incomplete``, which
a later run resumes with a byte-range request; a whole file is checked against the hub's hash
(sha256 for LFS files, the git blob sha1 for the others) and, for weights, its safetensors
header or torch archive, and only then takes its name.  A file that does not match is deleted
and named.  When all are there the folder gets :data:`RECORD` (the repositories, commits, files,
sizes and hashes verified) and is renamed ``<root>/<name>/``.  A release is on disk
(:func:`present`) when its folder holds that record and the files it names at their sizes; a
folder without one (a copy stopped half-way, an older download) goes back to ``.partial`` on the
next download, which keeps the files that verify and fetches the rest.  What goes wrong is one
:class:`DownloadError` naming the release, the repository or file, and what to do.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import shutil
import zipfile
from dataclasses import dataclass
from typing import Callable

#: the loader's label for a release that is not on disk yet
PREFIX = "download: "
#: what a verified download leaves in its folder: the release is complete when it is there
RECORD = "spec_ar_download.json"
INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"
#: a folder's weights as transformers and as diffusers save them, (index, single file) each, in the order sought
WEIGHT_NAMES = ((INDEX, SINGLE), ("diffusion_pytorch_model.safetensors.index.json",
                                  "diffusion_pytorch_model.safetensors"))
TORCH_ARCHIVES = (".pt", ".pth", ".ckpt", ".bin", ".jit")  # zip files when whole
_REPORT_EVERY = 2**20  # bytes between two progress reports
#: what a connection that failed raises (httpx's, httpx2's and requests' errors, by class name)
_TRANSPORT = {"TransportError", "ConnectionError", "RequestException"}
_RETRIES = 3  # a connection that broke after bringing bytes is resumed at once this often


class DownloadError(RuntimeError):
    """One clear line: which release, what went wrong, what to do."""


@dataclass(frozen=True)
class Source:
    repo: str  # the hub repository
    files: tuple[str, ...]  # what the loader opens: each must be in the repository
    optional: tuple[str, ...] = ()  # what the loader reads when there: fetched if the repository has it
    weights: bool = False  # transformers weights at the root: model.safetensors, or its index and every shard it names
    weights_in: tuple[str, ...] = ()  # folders whose weights are taken too (WEIGHT_NAMES: transformers' or diffusers')
    into: str = ""  # the folder inside the release's folder its files go to ("": the release's folder)


@dataclass(frozen=True)
class PinnedFile:
    path: str  # in the repository
    size: int
    sha1: str  # its git blob hash at the commit


@dataclass(frozen=True)
class Pinned:
    """Files of a GitHub repository at one commit, which the release needs and the hub does not carry,
    fetched from GitHub's raw file host (``raw_endpoint``) into the release's folder (by file name),
    each checked against the size and git blob hash pinned here: read from the repository at that
    commit (``git ls-tree -l COMMIT``), so what arrives is the authors' file or nothing."""
    repo: str  # github.com/OWNER/NAME
    commit: str  # the full commit id
    files: tuple[PinnedFile, ...]


@dataclass(frozen=True)
class Release:
    name: str  # the folder it lands in, under the pack's model folder
    family: str
    what: str
    sources: tuple[Source | Pinned, ...]
    gated: bool = False  # the hub asks for a token (and the licence accepted on the repository's page)


#: what transformers reads beside a folder's config, tokenizer and weights when it is there
_EXTRAS = ("generation_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
           "chat_template.json", "preprocessor_config.json", "processor_config.json")
_FAST = ("tokenizer.json", "tokenizer_config.json")  # a tokenizers file: what the loaders read (no sentencepiece)
_BPE = ("vocab.json", "merges.txt", "tokenizer_config.json")  # byte-level BPE, there whether saved slow or fast


def _hf(repo: str, tokenizer=_FAST, extras=()) -> Source:
    """A transformers folder: config, tokenizer, weights."""
    return Source(repo, ("config.json", *tokenizer), _EXTRAS + tuple(extras), weights=True)


_HEAD = ("config.json", "pytorch_model.bin")  # a LANTERN draft head
_VQGAN = Source("GAIR/Anole-7b-v0.1", ("tokenizer/vqgan.yaml", "tokenizer/vqgan.ckpt"))  # Meta's VQGAN
_COSMOS = Source("nvidia/Cosmos-1.0-Tokenizer-DV8x16x16", ("decoder.jit",))  # SimpleAR's image tokenizer
# Lumina-mGPT's tokenizer ships only with the 768 px release; the authors' code reads it from there for
# every size (FlexARItemProcessor's tokenizer="Alpha-VLLM/Lumina-mGPT-7B-768")
_LUMINA_TOKENIZER = Source("Alpha-VLLM/Lumina-mGPT-7B-768", _FAST, ("special_tokens_map.json",))
# Emu3.5's text tokenizer is not in its hub releases: the authors' code reads it from their repository
# (configs/example_config_t2i.py: tokenizer_path "./src/tokenizer_emu3_ibq"), at the commit the family follows
_EMU35_TOKENIZER = Pinned("github.com/baaivision/Emu3.5", "8fcf1da48f9c5252fe0a0b8dc842e07b6efcd745", (
    PinnedFile("src/tokenizer_emu3_ibq/emu3.tiktoken", 2561218, "9b9b0e0416d84d7c88333eb261c77e5fe2d7f7be"),
    PinnedFile("src/tokenizer_emu3_ibq/emu3_vision_tokens.txt", 3145774, "52054a53fc42d2b72bcd5e3fc72b03e42e063ded")))
# the IBQ vision tokenizer, inside the model's folder (where decoders.ibq.find_ibq looks first)
_IBQ = Source("BAAI/Emu3.5-VisionTokenizer", ("config.yaml", "model.ckpt"), into="Emu3.5-VisionTokenizer")
# GLM-Image's release, a diffusers folder: what the AR stage reads (loaders.glm_image: vision_language_encoder/,
# processor/) and the DiT stage (decoders.glm_dit, each part by its library's from_pretrained, safetensors only:
# transformer/, vae/, text_encoder/ and tokenizer/ the ByT5 glyph encoder, scheduler/); the optional files are
# what those classes read when there (the hub lists processor/preprocessor_config.json and chat_template.jinja,
# tokenizer/special_tokens_map.json and added_tokens.json)
_GLM_PROCESSOR = tuple(f"processor/{f}" for f in _EXTRAS if f != "generation_config.json")
_GLM_IMAGE = Source("zai-org/GLM-Image", (
    "model_index.json", "vision_language_encoder/config.json", "processor/tokenizer.json",
    "processor/tokenizer_config.json", "transformer/config.json", "vae/config.json", "text_encoder/config.json",
    "tokenizer/tokenizer_config.json", "scheduler/scheduler_config.json"), (
    "vision_language_encoder/generation_config.json", *_GLM_PROCESSOR, "tokenizer/special_tokens_map.json",
    "tokenizer/added_tokens.json"), weights_in=("vision_language_encoder", "transformer", "vae", "text_encoder"))

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
    Release("flan-t5-xl", "t5", "the text encoder of LlamaGen text-to-image", (_hf("google/flan-t5-xl"),)),
    Release("Janus-Pro-1B", "janus", "Janus-Pro 1B, 384 px (decoder included)",
            (_hf("deepseek-community/Janus-Pro-1B"),)),
    Release("Janus-Pro-7B", "janus", "Janus-Pro 7B, 384 px (decoder included)",
            (_hf("deepseek-community/Janus-Pro-7B"),)),
    Release("Lumina-mGPT-7B-512", "lumina", "Lumina-mGPT 7B, 512 px, with Meta's VQGAN",
            (Source("Alpha-VLLM/Lumina-mGPT-7B-512", ("config.json",), ("generation_config.json",), weights=True),
             _LUMINA_TOKENIZER, _VQGAN)),
    Release("Lumina-mGPT-7B-768", "lumina", "Lumina-mGPT 7B, 768 px, with Meta's VQGAN",
            (_hf("Alpha-VLLM/Lumina-mGPT-7B-768"), _VQGAN)),
    Release("Anole-7b-v0.1", "anole", "Anole 7B (Meta's layout), with Meta's VQGAN",
            (Source("GAIR/Anole-7b-v0.1", ("models/7b/params.json", "models/7b/consolidated.pth",
                                           "tokenizer/text_tokenizer.json", "tokenizer/vqgan.yaml",
                                           "tokenizer/vqgan.ckpt"), ("models/7b/consolidate_params.json",)),)),
    Release("Emu3-Gen-hf", "emu3", "Emu3-Gen 8B, 720 px (decoder included)",
            (_hf("Emu3-community/Emu3-Gen-hf", _BPE, ("tokenizer.json",)),)),
    Release("Emu3.5-Image", "emu35", "Emu3.5-Image 34B (text to image, CFG 5), with BAAI's tokenizer files and "
            "the IBQ vision tokenizer (68 GB in bfloat16)",
            (Source("BAAI/Emu3.5-Image", ("config.json",), ("generation_config.json",), weights=True),
             _EMU35_TOKENIZER, _IBQ)),
    Release("Emu3.5", "emu35", "Emu3.5 34B (the base world model: the authors recommend CFG 2 for it, the default 5 is "
            "Emu3.5-Image's), with "
            "BAAI's tokenizer files and the IBQ vision tokenizer (68 GB in bfloat16)",
            (Source("BAAI/Emu3.5", ("config.json",), ("generation_config.json",), weights=True),
             _EMU35_TOKENIZER, _IBQ)),
    Release("Liquid_V1_7B", "liquid", "Liquid 7B (on Gemma-7B), 512 px, with Meta's VQGAN",
            (_hf("Junfeng5/Liquid_V1_7B"), _VQGAN)),
    Release("Lumina-mGPT-2.0", "lumina2", "Lumina-mGPT 2.0 7B, 768 px, with SBER-MoVQGAN 270M",
            (_hf("Alpha-VLLM/Lumina-mGPT-2.0"), Source("ai-forever/MoVQGAN", ("movqgan_270M.ckpt",)))),
    Release("SimpleAR-0.5B-RL", "simplear", "SimpleAR 0.5B (on Qwen2.5, RL-tuned), 1024 px, with NVIDIA's Cosmos "
            "DV8x16x16 tokenizer", (_hf("Daniel0724/SimpleAR-0.5B-RL", _BPE, ("tokenizer.json",)), _COSMOS)),
    Release("SimpleAR-1.5B-RL", "simplear", "SimpleAR 1.5B (on Qwen2.5, RL-tuned), 1024 px, with NVIDIA's Cosmos "
            "DV8x16x16 tokenizer", (_hf("Daniel0724/SimpleAR-1.5B-RL", _BPE, ("tokenizer.json",)), _COSMOS)),
    Release("GLM-Image", "glm_image", "GLM-Image 9B AR + 7B DiT, text to image, diffusers layout", (_GLM_IMAGE,)),
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
    """The releases complete under ``root``: their folder holds the record of a verified
    download and the files it names, at their sizes."""
    root = pathlib.Path(root)
    return {name for name, r in RELEASES.items() if recorded(root / name, r) is not None}


def recorded(folder: pathlib.Path, release: Release) -> dict | None:
    """The record of ``folder``'s verified download of ``release`` when its files are all there
    at the sizes it names; None otherwise."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        if [s["repo"] for s in record["sources"]] != [s.repo for s in release.sources] or not record["files"]:
            return None  # another release's, or the release changed since
        for path, meta in record["files"].items():
            f = folder / path
            if not f.is_file() or f.stat().st_size != meta["size"]:
                return None
        return record
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


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
             progress: Callable[[int, int], None] | None = None, raw_endpoint: str | None = None) -> pathlib.Path:
    """Fetch release ``name`` into ``root / name`` (see the module docstring) and return that
    folder; a complete one already there is returned as it is.  ``progress(done, total)``
    hears the release's bytes on disk as they arrive; ``endpoint``: another hub (default:
    huggingface.co, or ``HF_ENDPOINT``); ``token``: default ``HF_TOKEN`` or the saved login (sent to
    the hub only); ``raw_endpoint``: where :class:`Pinned` files come from (default GitHub's
    :data:`RAW`, or ``SPEC_AR_RAW_ENDPOINT``)."""
    release = release_of(name)
    if release is None:
        raise DownloadError(f"model {name!r} is not a known release; known: {', '.join(RELEASES)}")
    root = pathlib.Path(root)
    final, partial = root / release.name, root / f"{release.name}.partial"
    if recorded(final, release) is not None:
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        if final.is_dir():  # no verified download: completed out of the loader's sight, keeping what verifies
            _merge(final, partial)
        partial.mkdir(exist_ok=True)
        _Download(release, partial, endpoint, token, progress, raw_endpoint).run()
        shutil.rmtree(partial / ".cache", ignore_errors=True)  # older versions' huggingface_hub bookkeeping
        partial.rename(final)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise DownloadError(f"{release.name}: the disk holding {root} is full; free space and run again "
                                "(what arrived is kept and resumes)") from None
        raise
    return final


RAW = "https://raw.githubusercontent.com"  # GitHub's raw files: OWNER/NAME/COMMIT/PATH


@dataclass(frozen=True)
class _Remote:
    """A file of a repository at a commit, as the hub lists it (or as it is pinned)."""
    repo: str
    commit: str
    path: str  # in the repository
    size: int
    algorithm: str  # sha256 (LFS files: the content's) or sha1 (others: the git blob's)
    digest: str
    dest: str = ""  # in the release's folder ("": ``path``)
    url: str = ""  # where it is fetched ("": the hub's URL of ``path``)

    @property
    def at(self) -> str:
        return self.dest or self.path


class _Download:
    def __init__(self, release: Release, folder: pathlib.Path, endpoint, token, progress, raw_endpoint=None):
        from huggingface_hub import HfApi, constants
        from huggingface_hub.utils import build_hf_headers, get_session

        self.release, self.folder, self.token, self.progress = release, folder, token, progress
        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        self.raw = (raw_endpoint or os.environ.get("SPEC_AR_RAW_ENDPOINT") or RAW).rstrip("/")
        self.timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
        self.api = HfApi(endpoint=self.endpoint, token=token)
        self.headers = build_hf_headers(token=token)
        self.session = get_session()
        self.done = self.total = self.reported = 0

    def run(self) -> None:
        listed = [self._list(source) for source in self.release.sources]  # what is missing is said before any fetch
        plan: dict[str, _Remote] = {}  # path in the folder -> file; a path two sources share comes from the first
        for source, (commit, listing) in zip(self.release.sources, listed):
            for remote in self._wanted(source, listing):
                plan.setdefault(remote.at, remote)
        self.total = sum(r.size for r in plan.values())
        self._check_room(plan.values())
        for remote in plan.values():
            self._ensure(remote)
        self._report(force=True)
        commits = [{"repo": s.repo, "commit": commit} for s, (commit, _) in zip(self.release.sources, listed)]
        record = {"release": self.release.name, "sources": commits,
                  "files": {r.at: {"repo": r.repo, **({"path": r.path} if r.dest else {}), "size": r.size,
                                   r.algorithm: r.digest} for r in plan.values()}}
        (self.folder / RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")

    # -- what to fetch ---------------------------------------------------------------------
    def _list(self, source: Source | Pinned) -> tuple[str, dict[str, _Remote]]:
        """``source``'s repository at its current commit (every file is taken from that one), its files
        by path; one error naming what the release needs and the repository lacks."""
        from huggingface_hub.hf_api import RepoFile

        if isinstance(source, Pinned):  # nothing to ask: the files are pinned
            owner_name = source.repo.removeprefix("github.com/")
            return source.commit, {f.path: _Remote(
                source.repo, source.commit, f.path, f.size, "sha1", f.sha1, dest=f.path.rsplit("/", 1)[-1],
                url=f"{self.raw}/{owner_name}/{source.commit}/{f.path}") for f in source.files}
        into = source.into.strip("/")
        try:
            commit = self.api.model_info(source.repo).sha or "main"
            entries = self.api.list_repo_tree(source.repo, recursive=True, revision=commit)
            listing = {e.path: _Remote(source.repo, commit, e.path, e.size,
                                       *(("sha256", e.lfs.sha256) if e.lfs else ("sha1", e.blob_id)),
                                       dest=f"{into}/{e.path}" if into else "")
                       for e in entries if isinstance(e, RepoFile)}
        except Exception as err:
            failure = self._failure(err, source.repo)
            if failure is None:
                raise
            raise failure from None
        absent = [f for f in source.files if f not in listing]
        for folder, names in _weight_folders(source):
            if _weights_file(folder, names, listing) is None:
                absent.append(f"{' or '.join(folder + single for _, single in names)} (or "
                              f"{' or '.join(folder + index for index, _ in names)} and its shards)")
        if absent:
            raise DownloadError(f"{self.release.name}: {source.repo} has no {', '.join(absent)}, which the loader "
                                "needs; check the repository on the hub (it may have changed), or report it")
        return commit, listing

    def _wanted(self, source: Source | Pinned, listing: dict[str, _Remote]) -> list[_Remote]:
        """The files of ``source`` the release takes: required, optional ones listed, weights."""
        if isinstance(source, Pinned):
            return list(listing.values())
        names = [*source.files, *(f for f in source.optional if f in listing)]
        for folder, sought in _weight_folders(source):
            found = _weights_file(folder, sought, listing)
            names += [found, *self._shards(listing[found], listing)] if found.endswith(".index.json") else [found]
        return [listing[n] for n in dict.fromkeys(names)]

    def _shards(self, index: _Remote, listing: dict[str, _Remote]) -> list[str]:
        """The shards ``index`` names (fetched first: a few kilobytes), each listed, as paths of the
        repository (an index names the files beside it)."""
        self._ensure(index, report=False)
        path = self.folder / index.at
        folder = index.path.rpartition("/")[0]
        try:
            shards = [f"{folder}/{s}" if folder else s for s in dict.fromkeys(
                json.loads(path.read_text(encoding="utf-8"))["weight_map"].values())]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            path.unlink(missing_ok=True)
            raise DownloadError(f"{self.release.name}: {index.path} of {index.repo} is no weight index "
                                f"({_first_line(err)}); report it to the repository") from None
        absent = [s for s in shards if s not in listing]
        if absent:
            raise DownloadError(f"{self.release.name}: {index.repo}'s {index.path} names {', '.join(absent)}, which "
                                "the repository lacks; report it to the repository")
        return shards

    def _check_room(self, files) -> None:
        """One error before the download when the disk cannot take what is still to come."""
        needed = 0
        for r in files:
            target = self.folder / r.at
            if not (target.is_file() and target.stat().st_size == r.size):
                part = target.with_name(target.name + ".incomplete")
                needed += r.size - (part.stat().st_size if part.is_file() else 0)
        free = shutil.disk_usage(self.folder).free
        if needed > free:
            raise DownloadError(f"{self.release.name}: needs {needed / 1e9:.1f} GB more, and the disk holding "
                                f"{self.folder.parent} has {free / 1e9:.1f} GB free; free space (or download "
                                "elsewhere) and run again")

    # -- one file --------------------------------------------------------------------------
    def _ensure(self, remote: _Remote, report: bool = True) -> None:
        """``remote`` in the folder, verified: kept when already there and matching, else fetched."""
        target = self.folder / remote.at
        if target.is_file():
            if target.stat().st_size == remote.size and _hash_file(remote, target) == remote.digest \
                    and _damage(target) is None:
                self._advance(remote.size if report else 0)
                return
            target.unlink()  # not the hub's file: fetched again
        self._fetch(remote, target, report)

    def _fetch(self, remote: _Remote, target: pathlib.Path, report: bool) -> None:
        """``remote`` streamed into ``target``'s ``.incomplete`` part (resumed from what it holds), checked,
        and renamed ``target``."""
        from huggingface_hub import hf_hub_url

        part = target.with_name(target.name + ".incomplete")
        target.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.is_file() else 0
        if have > remote.size:
            have = 0
        hasher = _hasher(remote)
        if have:  # what an earlier run left: read back into the hash, then continued
            _feed(hasher, part)
        counted = have if report else 0  # bytes of this file in the progress
        self._advance(counted)
        url = remote.url or hf_hub_url(remote.repo, remote.path, revision=remote.commit, endpoint=self.endpoint)
        sent = {} if remote.url else self.headers  # the hub's token goes to the hub only
        retries = _RETRIES
        while have < remote.size:
            start = have
            try:
                headers = dict(sent, **({"Range": f"bytes={have}-"} if have else {}))
                with _get(self.session, url, headers, self.timeout) as (status, answer, reason, chunks):
                    if status >= 400 and remote.url:
                        raise DownloadError(f"{self.release.name}: {url} answered {status} {reason}: the release "
                                            f"needs {remote.path} of {remote.repo} at {remote.commit[:7]}; run again "
                                            "later, or put the file in the model folder by hand")
                    if status >= 400:
                        raise self._refused(status, answer, reason, remote.repo, remote.path)
                    if have and status != 206:  # the range was ignored: the whole file comes
                        have, hasher = 0, _hasher(remote)
                    with open(part, "ab" if have else "wb") as out:
                        for chunk in chunks:
                            out.write(chunk)
                            hasher.update(chunk)
                            have += len(chunk)
                            if report:
                                self._advance(have - counted)
                                counted = have
                            if have > remote.size:
                                break
            except DownloadError:
                raise
            except Exception as err:
                if not _kinds(err) & _TRANSPORT:
                    raise
                if have > start and retries:  # it was moving: go on from there at once
                    retries -= 1
                    continue
                if have == 0:
                    raise self._unreachable(err, self.raw if remote.url else None) from None
                raise DownloadError(f"{self.release.name}: the connection broke while fetching {remote.path} from "
                                    f"{remote.repo} ({_first_line(err)}) after {have} of {remote.size} bytes; run "
                                    "again: it resumes there") from None
            if have > remote.size:
                break
        if have != remote.size or hasher.hexdigest() != remote.digest:
            part.unlink(missing_ok=True)
            self._advance(-counted)
            listed = "pinned" if remote.url else "the hub lists"
            raise DownloadError(f"{self.release.name}: {remote.path} from {remote.repo} does not match the "
                                f"{remote.algorithm} {listed} for it (it arrived damaged); it was removed: "
                                "run again to fetch it again")
        os.replace(part, target)
        problem = _damage(target)
        if problem is not None:
            target.unlink()
            raise DownloadError(f"{self.release.name}: {remote.path} arrived damaged ({problem}); it was removed: "
                                "run again to fetch it again")
        self._report(force=True)

    # -- progress --------------------------------------------------------------------------
    def _advance(self, n: int) -> None:
        self.done += n
        self._report()

    def _report(self, force: bool = False) -> None:
        if self.progress is not None and self.total and (force or abs(self.done - self.reported) >= _REPORT_EVERY):
            self.reported = self.done
            self.progress(self.done, self.total)

    # -- failures --------------------------------------------------------------------------
    def _failure(self, err: Exception, repo: str) -> DownloadError | None:
        """The error for a failed request of the hub's API; None for one that is no such failure."""
        from huggingface_hub import errors

        if isinstance(err, errors.OfflineModeIsEnabled):
            return DownloadError(f"{self.release.name}: huggingface_hub is set offline (HF_HUB_OFFLINE); unset it "
                                 f"to download {repo}")
        response = getattr(err, "response", None)
        if isinstance(getattr(response, "status_code", None), int):
            reason = getattr(response, "reason_phrase", None) or getattr(response, "reason", None) or ""
            return self._refused(response.status_code, response.headers, reason, repo)
        if _kinds(err) & _TRANSPORT:
            return self._unreachable(err)
        return None

    def _unreachable(self, err: Exception, host: str | None = None) -> DownloadError:
        where = host or f"the hub at {self.endpoint}"
        return DownloadError(f"{self.release.name}: cannot reach {where} ({_first_line(err)}): no network? Run again "
                             "when online (what arrived is kept and resumes)")

    def _refused(self, status: int, headers, reason: str, repo: str, path: str | None = None) -> DownloadError:
        """What the hub's error answer (``status``, its ``headers``) means, for ``repo`` (or its file ``path``)."""
        name = self.release.name
        code = headers.get("X-Error-Code") or ""
        message = (headers.get("X-Error-Message") or "").strip()
        what = f"{path} of {repo}" if path else repo
        page = f"{self.endpoint}/{repo}"
        if code == "GatedRepo":
            return DownloadError(f"{name}: {repo} is gated: accept its licence on its page on the hub ({page}), then "
                                 "log in (`hf auth login`) or set HF_TOKEN with that account's token, and run again")
        if status == 401 and self._token_sent():
            return DownloadError(f"{name}: the hub refused the token {self._token_source()} (401 Unauthorized: "
                                 f"{message or 'invalid credentials'}): it is invalid or expired. Make a new one at "
                                 f"{self.endpoint}/settings/tokens and set HF_TOKEN to it, or log in again (`hf auth "
                                 "login`); public releases need no token (unset HF_TOKEN)")
        if status == 401 or code == "RepoNotFound":
            return DownloadError(f"{name}: the hub has no repository {repo} (or it needs a token: set HF_TOKEN or "
                                 "log in with `hf auth login`)")
        if status == 403:
            return DownloadError(f"{name}: the hub forbids access to {what} (403 Forbidden"
                                 f"{': ' + message if message else ''}): accept the licence on {page} with your "
                                 "account, and check that your token (HF_TOKEN or `hf auth login`) may read it")
        if status == 404 and path:
            return DownloadError(f"{name}: the hub has no {path} in {repo} (404 Not Found), though it listed it: the "
                                 "repository changed meanwhile; run again, or report it if it stays")
        if status == 429 or status >= 500:
            return DownloadError(f"{name}: the hub answered {status} {reason} for {what}; run again later (what "
                                 "arrived is kept and resumes)")
        return DownloadError(f"{name}: the hub answered {status} {reason} for {what}"
                             f"{' (' + message + ')' if message else ''}")

    def _token_sent(self) -> bool:
        return any(k.lower() == "authorization" for k in self.headers)

    def _token_source(self) -> str:
        if self.token:
            return "given"
        if os.environ.get("HF_TOKEN"):
            return "in HF_TOKEN"
        if os.environ.get("HUGGING_FACE_HUB_TOKEN"):
            return "in HUGGING_FACE_HUB_TOKEN"
        return "saved by `hf auth login`"


@contextlib.contextmanager
def _get(session, url: str, headers: dict, timeout):
    """A streamed GET through huggingface_hub's session, httpx's (huggingface_hub >= 1.0) or requests'
    (before): ``(status, headers, reason, chunks as they arrive)``."""
    if callable(getattr(session, "stream", None)):  # (a requests session has a flag of that name)
        with session.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as response:
            yield response.status_code, response.headers, response.reason_phrase, response.iter_bytes()
    else:
        with session.get(url, headers=headers, stream=True, allow_redirects=True, timeout=timeout) as response:
            # (chunks of a size: without one urllib3 reads to the end before it yields)
            yield response.status_code, response.headers, response.reason, response.iter_content(chunk_size=2**16)


def _weight_folders(source: Source) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """``(folder as a path prefix, the names sought there)`` of each folder whose weights ``source`` takes: the
    root with transformers' names (``weights``), each of ``weights_in`` with transformers' or diffusers'."""
    return ([("", WEIGHT_NAMES[:1])] if source.weights else []) + [
        (f"{folder.strip('/')}/", WEIGHT_NAMES) for folder in source.weights_in]


def _weights_file(folder: str, names, listing) -> str | None:
    """The path of the weights in ``folder`` the repository lists: the first naming it has, its index before its
    single file; None without."""
    return next((folder + name for pair in names for name in pair if folder + name in listing), None)


def _merge(folder: pathlib.Path, partial: pathlib.Path) -> None:
    """``folder``'s files into ``partial`` (those it lacks), and ``folder`` gone."""
    if not partial.exists():
        folder.rename(partial)
        return
    for f in sorted(folder.rglob("*")):
        dest = partial / f.relative_to(folder)
        if f.is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            f.rename(dest)
    shutil.rmtree(folder)


def _hasher(remote: _Remote):
    """The hash the hub lists: a git blob's sha1 covers a header with the size."""
    if remote.algorithm == "sha256":
        return hashlib.sha256()
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % remote.size)
    return digest


def _feed(digest, path: pathlib.Path) -> None:
    with open(path, "rb") as f:
        while block := f.read(2**22):
            digest.update(block)


def _hash_file(remote: _Remote, path: pathlib.Path) -> str:
    digest = _hasher(remote)
    _feed(digest, path)
    return digest.hexdigest()


def _damage(path: pathlib.Path) -> str | None:
    """Why a weights file that matches its hash cannot be read (a broken upload), or None."""
    from ..formats.checkpoints import safetensors_header

    try:
        if path.suffix == ".safetensors":
            safetensors_header(path)
        elif path.suffix in TORCH_ARCHIVES and not zipfile.is_zipfile(path):
            return "not a whole torch archive"
    except Exception as err:
        return _first_line(err)
    return None


def _kinds(err: BaseException) -> set[str]:
    """The class names of ``err`` and its bases: the HTTP clients' errors read alike."""
    return {k.__name__ for k in type(err).__mro__}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def default_root() -> pathlib.Path:
    """Where the command line puts downloads: ComfyUI's ``models/spec_ar`` when run inside
    a ComfyUI checkout (``SPEC_AR_MODELS`` overrides), else ``./models/spec_ar``."""
    if os.environ.get("SPEC_AR_MODELS"):
        return pathlib.Path(os.environ["SPEC_AR_MODELS"])
    here = pathlib.Path(__file__).resolve().parents[1]
    if here.parent.name == "custom_nodes":
        return here.parent.parent / "models" / "spec_ar"
    return pathlib.Path("models") / "spec_ar"
