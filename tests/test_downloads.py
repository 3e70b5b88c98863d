"""Models on first use, through the real huggingface_hub and HTTP clients against a local server
that serves files the way the hub does (tests/fake_hub.py), every release laid out as its real
repositories lay it out (tests/hub_releases.py): every release downloads, verifies against the
hashes the hub lists and loads; an interrupted file resumes; a file that does not match its hash,
and a broken upload, are refused by name and not used; a half-filled release folder is not on disk
and is completed; no network, a gated or forbidden repository, a rejected token and a missing file
each give one clear error naming it; one Ctrl-C stops a download, and the next run resumes it."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from spec_ar.loaders import downloads
from spec_ar.loaders.downloads import RECORD, DownloadError

from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_vq
from .fake_hub import FakeHub
from .hub_releases import STAND_IN, pinned_to, repos_for

REPO = "FoundationVision/LlamaGen"
NAME = "LlamaGen-c2i-B-256"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("release")
    gpt = write_gpt(d / "c2i_B_256.pt", random_gpt(tiny_gpt_spec("c2i"), seed=2))
    vq = write_vq(d / "vq_ds16_c2i.pt")
    # the repository holds more than the release needs: only its files are fetched
    return {"c2i_B_256.pt": gpt.read_bytes(), "vq_ds16_c2i.pt": vq.read_bytes(), "c2i_XXL_384.pt": b"x" * 1000,
            "README.md": b"# LlamaGen\n"}


@pytest.fixture()
def hub(files, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token or cache of the user's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub({REPO: dict(files)}) as server:
        yield server


def gets(hub, name: str) -> list[str | None]:
    """The Range headers of the hub's GETs of file ``name`` (None: the whole file)."""
    return [r for m, p, r in hub.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name)]


def on_disk(folder: pathlib.Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_first_use_downloads_the_release_and_it_renders(hub, tmp_path, files):
    from spec_ar.loaders.detect import load_model
    from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

    root = tmp_path / "models" / "spec_ar"
    assert downloads.PREFIX + NAME in downloads.missing(root)
    seen = []
    folder = downloads.download(NAME, root, endpoint=hub.url, progress=lambda done, total: seen.append(done))
    assert folder == root / NAME
    assert on_disk(folder) == ["c2i_B_256.pt", RECORD, "vq_ds16_c2i.pt"]  # nothing else, no .cache
    assert not (root / f"{NAME}.partial").exists()
    assert seen and seen[-1] == len(files["c2i_B_256.pt"]) + len(files["vq_ds16_c2i.pt"])
    assert NAME in downloads.present(root) and downloads.PREFIX + NAME not in downloads.missing(root)
    model = load_model(folder)
    result = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd")).generate([3], seeds=1)
    assert result.tokens.shape[1] == model.adapter.layout.length
    assert model.decode_images(result.image_tokens(model.adapter.layout)).shape[0] == 1
    # a second use finds it complete and asks the hub nothing
    asked = len(hub.requests)
    assert downloads.download(NAME, root, endpoint=hub.url) == folder and len(hub.requests) == asked


@pytest.mark.parametrize("name", list(downloads.RELEASES))
def test_every_release_downloads_verifies_and_loads_from_its_real_layout(name, tmp_path, monkeypatch):
    """Each release from its repositories as they are laid out on the hub: what its loader needs is
    fetched (required files, the optional ones the repository has, the shards its index names), nothing
    else, each checked against the hash the hub lists; the folder is recorded complete and loads."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repos = repos_for(name, tmp_path / "hub")
    release = pinned_to(downloads.RELEASES[name], repos)
    monkeypatch.setitem(downloads.RELEASES, name, release)
    root = tmp_path / "models"
    with FakeHub(repos) as hub:
        folder = downloads.download(name, root, endpoint=hub.url, raw_endpoint=hub.url + "/github")
        asked = len(hub.requests)
        assert downloads.download(name, root, endpoint=hub.url) == folder and len(hub.requests) == asked
    record = json.loads((folder / RECORD).read_text())
    assert on_disk(folder) == sorted([*record["files"], RECORD])
    assert [s["repo"] for s in record["sources"]] == [s.repo for s in release.sources]
    for source in release.sources:
        if isinstance(source, downloads.Pinned):  # by file name, into the release's folder
            assert {f.path.rsplit("/", 1)[-1] for f in source.files} <= set(record["files"]), source.repo
            continue
        into = f"{source.into}/" if source.into else ""
        assert {into + f for f in source.files} <= set(record["files"]), source.repo
        if source.weights:
            assert any(f.endswith(".safetensors") for f in record["files"])
        for part in source.weights_in:  # each folder's weights (a diffusers release's components)
            assert any(f.startswith(f"{into}{part}/") and f.endswith(".safetensors") for f in record["files"]), part
    for path, meta in record["files"].items():
        content = repos[meta["repo"]][meta.get("path", path)]
        assert (folder / path).read_bytes() == content and meta["size"] == len(content) and content != STAND_IN
    assert "README.md" not in record["files"] and ".gitattributes" not in record["files"]
    assert name in downloads.present(root) and not (root / f"{name}.partial").exists()
    load(release, folder, tmp_path)


def load(release, folder: pathlib.Path, tmp_path: pathlib.Path):
    """The release's folder through the loader that offers it."""
    if release.family == "drafter":
        from spec_ar.loaders.draft_head import load_head

        return load_head(folder)
    if release.family == "t5":
        from spec_ar.loaders.t5 import T5TextEncoder

        return T5TextEncoder(folder)
    from spec_ar.loaders.detect import load_model

    from .checkpoints import write_t5

    text = write_t5(tmp_path / "t5") if release.name.startswith("LlamaGen-t2i") else None
    model = load_model(folder, text_encoder=text)
    assert model.family == release.family
    if release.family == "glm_image":  # the DiT stage's folders came too: the model decodes
        assert model.decode is not None, model.info.get("no_decoder")
    return model


@pytest.mark.parametrize("name, repo, file, algorithm", [
    (NAME, REPO, "c2i_B_256.pt", "sha256"),  # LFS files: the content's sha256
    ("flan-t5-xl", "google/flan-t5-xl", "model-00002-of-00002.safetensors", "sha256"),
    ("flan-t5-xl", "google/flan-t5-xl", "tokenizer.json", "sha1")])  # a plain git file: its blob's sha1
def test_a_flipped_byte_is_refused_naming_the_file(name, repo, file, algorithm, tmp_path, monkeypatch):
    """The hub serves the file with one byte flipped (same size, still a readable archive or header):
    it does not match the hash the hub lists, so it is deleted and named, the release is not on disk,
    and the next run (the hub mended) completes it."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repos = repos_for(name, tmp_path / "hub")
    good = repos[repo][file]
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    root = tmp_path / "models"
    with FakeHub(repos) as hub:
        hub.corrupt[file] = bytes(flipped)
        with pytest.raises(DownloadError, match=rf"{name}: {file} from {repo} does not match the {algorithm} the hub "
                                                r"lists for it .* removed: run again"):
            downloads.download(name, root, endpoint=hub.url)
        assert name not in downloads.present(root) and not (root / name).exists()
        assert not [p for p in (root / f"{name}.partial").rglob("*") if p.name.startswith(file)]
        hub.corrupt.clear()
        assert (downloads.download(name, root, endpoint=hub.url) / file).read_bytes() == good


def test_a_partial_release_folder_is_not_on_disk_and_is_fetched_to_completion(hub, tmp_path, files, capsys):
    """A folder holding one of a release's files is no release: not on disk for the loader or --list,
    and the next download keeps the file that verifies, fetches the rest and records it complete."""
    from spec_ar.cli import main

    root = tmp_path / "models"
    (root / NAME).mkdir(parents=True)
    (root / NAME / "c2i_B_256.pt").write_bytes(files["c2i_B_256.pt"])
    assert NAME not in downloads.present(root) and downloads.PREFIX + NAME in downloads.missing(root)
    assert main(["download", "--list", "--to", str(root)]) == 0
    width = max(map(len, downloads.RELEASES))
    assert f"{NAME:{width}s} {'-':8s} " in capsys.readouterr().out
    folder = downloads.download(NAME, root, endpoint=hub.url)
    assert gets(hub, "c2i_B_256.pt") == [] and gets(hub, "vq_ds16_c2i.pt") == [None]  # the kept file verified
    assert on_disk(folder) == ["c2i_B_256.pt", RECORD, "vq_ds16_c2i.pt"] and NAME in downloads.present(root)
    # a recorded file that went missing (or changed size) makes it incomplete again
    (folder / "vq_ds16_c2i.pt").unlink()
    assert NAME not in downloads.present(root)
    downloads.download(NAME, root, endpoint=hub.url)
    assert gets(hub, "c2i_B_256.pt") == [] and gets(hub, "vq_ds16_c2i.pt") == [None, None]
    assert (folder / "vq_ds16_c2i.pt").read_bytes() == files["vq_ds16_c2i.pt"] and NAME in downloads.present(root)


def test_an_interrupted_file_resumes_where_it_stopped(hub, tmp_path):
    import io

    import torch

    # a file larger than a network read, cut after part of it arrived
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.arange(3_300_000, dtype=torch.float32)}}, buffer)
    big = buffer.getvalue()
    cut = 10 * 2**20 + 12345
    hub.repos[REPO]["c2i_B_256.pt"] = big
    hub.cut["c2i_B_256.pt"] = cut
    root = tmp_path / "models"
    try:
        downloads.download(NAME, root, endpoint=hub.url)
    except DownloadError as err:  # the client gave up: the next run resumes from the kept part
        assert "run again" in str(err)
        downloads.download(NAME, root, endpoint=hub.url)
    assert gets(hub, "c2i_B_256.pt") == [None, f"bytes={cut}-"], hub.requests  # every arrived byte is kept
    assert (root / NAME / "c2i_B_256.pt").read_bytes() == big


def test_files_stream_and_resume_through_requests_as_huggingface_hub_before_1_0_hands_it_out(
        hub, tmp_path, files, monkeypatch):
    """huggingface_hub < 1.0 (the one transformers 4 takes) gives a requests session, not an httpx one."""
    import requests
    from huggingface_hub import utils

    monkeypatch.setattr(utils, "get_session", requests.Session)
    hub.cut["c2i_B_256.pt"] = 100_000
    folder = downloads.download(NAME, tmp_path / "models", endpoint=hub.url)
    first, then = gets(hub, "c2i_B_256.pt")
    assert first is None and 0 < int(then.removeprefix("bytes=").removesuffix("-")) <= 100_000
    assert (folder / "c2i_B_256.pt").read_bytes() == files["c2i_B_256.pt"] and NAME in downloads.present(folder.parent)


def test_a_damaged_file_is_caught_and_not_used(hub, tmp_path, files):
    root = tmp_path / "models"
    hub.repos[REPO]["c2i_B_256.pt"] = files["c2i_B_256.pt"][: len(files["c2i_B_256.pt"]) // 2]  # a broken upload
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: c2i_B_256.pt arrived damaged .* run again"):
        downloads.download(NAME, root, endpoint=hub.url)
    assert not (root / NAME).exists()  # no folder a later run would take as complete
    assert not (root / f"{NAME}.partial" / "c2i_B_256.pt").exists()
    hub.repos[REPO]["c2i_B_256.pt"] = files["c2i_B_256.pt"]  # mended on the hub: the next run completes
    assert (downloads.download(NAME, root, endpoint=hub.url) / "c2i_B_256.pt").read_bytes() == files["c2i_B_256.pt"]


def test_offline_is_one_clear_error(hub, tmp_path):
    closed = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: cannot reach the hub .*no network\?"):
        downloads.download(NAME, tmp_path / "models", endpoint=closed)
    assert not (tmp_path / "models" / NAME).exists()


def test_a_gated_repository_asks_for_a_token_and_the_server_keeps_serving(hub, tmp_path):
    hub.gated.add(REPO)
    with pytest.raises(DownloadError, match=r"FoundationVision/LlamaGen is gated: accept its licence .*HF_TOKEN"):
        downloads.download(NAME, tmp_path / "models", endpoint=hub.url)
    hub.gated.clear()
    assert (downloads.download(NAME, tmp_path / "models", endpoint=hub.url) / "vq_ds16_c2i.pt").is_file()


def test_a_forbidden_repository_is_named_as_refused_not_as_no_network(hub, tmp_path):
    hub.forbidden.add(REPO)
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: the hub forbids access to FoundationVision/LlamaGen "
                                            r"\(403 Forbidden: .*fine-grained.*\): accept the licence .*token") as err:
        downloads.download(NAME, tmp_path / "models", endpoint=hub.url)
    assert "network" not in str(err.value)


def test_an_invalid_hf_token_is_named(hub, tmp_path, monkeypatch):
    hub.tokens = {"hf_valid"}
    monkeypatch.setenv("HF_TOKEN", "hf_expired")
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: the hub refused the token in HF_TOKEN \(401 "
                                            r"Unauthorized: Invalid credentials.*\): it is invalid or expired.* "
                                            r"set HF_TOKEN .*`hf auth login`"):
        downloads.download(NAME, tmp_path / "models", endpoint=hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_valid")  # a valid token is sent and taken
    assert NAME in downloads.present(downloads.download(NAME, tmp_path / "models", endpoint=hub.url).parent)


def test_a_listed_file_the_hub_does_not_serve_is_named(hub, tmp_path):
    hub.gone.add("vq_ds16_c2i.pt")
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: the hub has no vq_ds16_c2i.pt in "
                                            r"FoundationVision/LlamaGen \(404 Not Found\), though it listed it"):
        downloads.download(NAME, tmp_path / "models", endpoint=hub.url)
    assert NAME not in downloads.present(tmp_path / "models")


def test_a_file_the_release_needs_and_the_repository_lacks_is_named_before_anything_is_fetched(hub, tmp_path):
    del hub.repos[REPO]["vq_ds16_c2i.pt"]
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: FoundationVision/LlamaGen has no vq_ds16_c2i.pt, "
                                            r"which the loader needs"):
        downloads.download(NAME, tmp_path / "models", endpoint=hub.url)
    assert gets(hub, "c2i_B_256.pt") == []


def test_one_ctrl_c_stops_a_download_and_the_next_run_resumes_it(hub, tmp_path, files):
    """``spec-ar download`` against a slow hub, one SIGINT while a file is arriving: the process ends at
    once (exit 130) without taking the rest of the file, what arrived is kept, and the next run asks the
    hub only for the bytes after it."""
    big = files["c2i_B_256.pt"]
    hub.slow["c2i_B_256.pt"] = 0.05  # 8 KB per 50 ms: tens of seconds for the whole file
    root = tmp_path / "models"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPEC_AR_DEBUG")}
    # Ctrl-C as at a terminal: a test run started in the background by a shell ignores SIGINT, and so would the
    # child's Python (it keeps an ignored SIGINT ignored) unless the child starts with the default disposition
    proc = subprocess.Popen([sys.executable, "-m", "spec_ar.cli", "download", NAME, "--to", str(root),
                             "--endpoint", hub.url], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    part = root / f"{NAME}.partial" / "c2i_B_256.pt.incomplete"
    try:
        deadline = time.monotonic() + 120  # guards only: the whole file takes about 20 s
        while hub.sent.get("c2i_B_256.pt", 0) < 3 * 8192 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        settle = time.monotonic() + 5  # until the first bytes are on disk
        while not (part.is_file() and part.stat().st_size) and time.monotonic() < settle:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)  # once, while the file is arriving
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    sent = hub.sent["c2i_B_256.pt"]
    assert sent < len(big) // 2, (sent, len(big))  # the transfer stopped with the process, not at the file's end
    assert [line for line in err.split("\n") if "interrupted" in line] == ["interrupted"], err  # on its own line
    kept = part.stat().st_size
    assert 0 < kept <= sent and NAME not in downloads.present(root)
    hub.slow.clear()
    folder = downloads.download(NAME, root, endpoint=hub.url)
    assert gets(hub, "c2i_B_256.pt") == [None, f"bytes={kept}-"]
    assert (folder / "c2i_B_256.pt").read_bytes() == big and not part.exists()


def test_the_error_is_printed_on_its_own_line_after_the_progress(hub, tmp_path, capsys):
    from spec_ar.cli import main

    hub.failing.add("vq_ds16_c2i.pt")  # after c2i_B_256.pt arrived, with its progress on the line
    assert main(["download", NAME, "--to", str(tmp_path / "models"), "--endpoint", hub.url]) == 2
    err = capsys.readouterr().err
    assert " MB" in err  # the progress was shown
    errors = [line for line in err.split("\n") if "error:" in line]
    assert errors == [errors[0]] and errors[0].startswith("error: LlamaGen-c2i-B-256: the hub answered 500 "), err
    assert "vq_ds16_c2i.pt of FoundationVision/LlamaGen; run again later" in errors[0]


def test_an_unknown_release_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(DownloadError, match="not a known release; known: LlamaGen-c2i-B-256, "):
        downloads.download("Stable-Diffusion", tmp_path)


def test_every_release_names_its_files_and_families_the_loaders_know():
    from spec_ar.loaders.detect import BY_NAME

    for release in downloads.RELEASES.values():
        hub = [s for s in release.sources if isinstance(s, downloads.Source)]
        assert hub and all(s.repo.count("/") == 1 and s.files for s in hub)
        assert all("*" not in f for s in hub for f in s.files + s.optional), release  # names, not patterns
        assert release.family in BY_NAME or release.family in ("t5", "drafter"), release
        # weights folders by name, inside the repository
        assert all(w and "*" not in w and w.strip("/") == w for s in hub for w in s.weights_in), release
        for s in release.sources:
            if isinstance(s, downloads.Pinned):  # a full commit id, each file's size and blob hash
                assert s.repo.startswith("github.com/") and len(s.commit) == 40 and int(s.commit, 16) >= 0
                assert s.files and all(f.size > 0 and len(f.sha1) == 40 and int(f.sha1, 16) >= 0 for f in s.files)


GLM = "GLM-Image"


@pytest.fixture(scope="module")
def glm_repos(tmp_path_factory):
    """zai-org/GLM-Image as the hub lays it out (tests/hub_releases.py), built once."""
    return repos_for(GLM, tmp_path_factory.mktemp("glm-hub"))


@pytest.mark.parametrize("removed, named", [
    # a shard the DiT's index names (weights inside a folder: the index's shards are beside it)
    ("transformer/diffusion_pytorch_model-00002-of-00003.safetensors",
     r"GLM-Image: zai-org/GLM-Image's transformer/diffusion_pytorch_model\.safetensors\.index\.json names "
     r"transformer/diffusion_pytorch_model-00002-of-00003\.safetensors, which the repository lacks; report it"),
    # the VAE's safetensors (its pickled weights beside them are never taken in their place)
    ("vae/diffusion_pytorch_model.safetensors",
     r"GLM-Image: zai-org/GLM-Image has no vae/model\.safetensors or vae/diffusion_pytorch_model\.safetensors \(or "
     r"vae/model\.safetensors\.index\.json or vae/diffusion_pytorch_model\.safetensors\.index\.json and its "
     r"shards\), which the loader needs")])
def test_weights_a_folder_of_the_release_lacks_are_named_before_anything_large_is_fetched(
        removed, named, glm_repos, tmp_path, monkeypatch):
    """GLM-Image takes the weights of four folders of its repository: one that the repository lacks (a shard its
    index names, or the folder's weights file) is one error naming it, before any weights are fetched (the
    indexes only, a few kilobytes), and the release is not on disk."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repos = {repo: dict(files) for repo, files in glm_repos.items()}
    del repos["zai-org/GLM-Image"][removed]
    root = tmp_path / "models"
    with FakeHub(repos) as hub:
        with pytest.raises(DownloadError, match=named):
            downloads.download(GLM, root, endpoint=hub.url)
        fetched = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert not [p for p in fetched if p.endswith((".safetensors", ".bin"))], fetched
    assert GLM not in downloads.present(root) and not (root / GLM).exists()


EMU35 = "Emu3.5-Image"


@pytest.fixture()
def emu35_hub(tmp_path, monkeypatch):
    """Emu3.5-Image's repositories and the authors' tokenizer files on the stand-in GitHub, pinned."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repos = repos_for(EMU35, tmp_path / "hub")
    monkeypatch.setitem(downloads.RELEASES, EMU35, pinned_to(downloads.RELEASES[EMU35], repos))
    with FakeHub(repos) as hub:
        yield hub


def test_emu35s_tokenizer_comes_from_the_authors_repository_at_the_pinned_commit_without_the_hub_token(
        emu35_hub, tmp_path, monkeypatch):
    """The tokenizer files come from GitHub at the commit the family follows, land in the model folder with
    the vision tokenizer in its own folder inside, and the loader finds both; the hub's token (a user who is
    logged in) goes to the hub only."""
    monkeypatch.setenv("HF_TOKEN", "hf_user")
    source = next(s for s in downloads.RELEASES[EMU35].sources if isinstance(s, downloads.Pinned))
    folder = downloads.download(EMU35, tmp_path / "models", endpoint=emu35_hub.url,
                                raw_endpoint=emu35_hub.url + "/github")
    raw = [p for m, p, _ in emu35_hub.requests if p.startswith("/github/")]
    assert sorted(raw) == [f"/github/baaivision/Emu3.5/{source.commit}/src/tokenizer_emu3_ibq/{name}"
                           for name in ("emu3.tiktoken", "emu3_vision_tokens.txt")]
    assert not [p for p in emu35_hub.authorized if p.startswith("/github/")]
    assert [p for p in emu35_hub.authorized if p.startswith("/api/")]  # the hub did get it
    assert {"emu3.tiktoken", "emu3_vision_tokens.txt", "Emu3.5-VisionTokenizer/config.yaml",
            "Emu3.5-VisionTokenizer/model.ckpt"} <= set(on_disk(folder))
    record = json.loads((folder / RECORD).read_text())
    assert record["files"]["emu3.tiktoken"]["path"] == "src/tokenizer_emu3_ibq/emu3.tiktoken"
    assert record["sources"][1] == {"repo": "github.com/baaivision/Emu3.5", "commit": source.commit}
    assert load(downloads.RELEASES[EMU35], folder, tmp_path).family == "emu35"


def test_a_tokenizer_file_that_is_not_the_pinned_one_is_refused_naming_it(emu35_hub, tmp_path):
    emu35_hub.corrupt["src/tokenizer_emu3_ibq/emu3.tiktoken"] = b"x" + emu35_hub.repos[
        "github.com/baaivision/Emu3.5"]["src/tokenizer_emu3_ibq/emu3.tiktoken"][1:]
    root = tmp_path / "models"
    with pytest.raises(DownloadError, match=r"Emu3.5-Image: src/tokenizer_emu3_ibq/emu3.tiktoken from "
                                            r"github.com/baaivision/Emu3.5 does not match the sha1 pinned for it"):
        downloads.download(EMU35, root, endpoint=emu35_hub.url, raw_endpoint=emu35_hub.url + "/github")
    assert EMU35 not in downloads.present(root)
    del emu35_hub.corrupt["src/tokenizer_emu3_ibq/emu3.tiktoken"]
    downloads.download(EMU35, root, endpoint=emu35_hub.url, raw_endpoint=emu35_hub.url + "/github")
    assert EMU35 in downloads.present(root)


def test_github_not_serving_a_pinned_file_is_named_with_what_to_do(emu35_hub, tmp_path):
    del emu35_hub.repos["github.com/baaivision/Emu3.5"]["src/tokenizer_emu3_ibq/emu3_vision_tokens.txt"]
    with pytest.raises(DownloadError, match=r"Emu3.5-Image: http://127.0.0.1:\d+/github/baaivision/Emu3.5/8fcf1da"
                                            r"\w+/src/tokenizer_emu3_ibq/emu3_vision_tokens.txt answered 404 Not Found: "
                                            r"the release needs src/tokenizer_emu3_ibq/emu3_vision_tokens.txt of "
                                            r"github.com/baaivision/Emu3.5 at 8fcf1da; run again later, or put the "
                                            r"file in the model folder by hand"):
        downloads.download(EMU35, tmp_path / "models", endpoint=emu35_hub.url, raw_endpoint=emu35_hub.url + "/github")


def test_the_command_line_downloads_and_lists(hub, tmp_path, capsys):
    from spec_ar.cli import main

    root = tmp_path / "models"
    assert main(["download", NAME, "--to", str(root), "--endpoint", hub.url]) == 0
    assert pathlib.Path(capsys.readouterr().out.strip()) == root / NAME
    assert main(["download", "--list", "--to", str(root)]) == 0
    listed = capsys.readouterr().out
    width = max(map(len, downloads.RELEASES))
    assert f"{NAME:{width}s} on disk" in listed and "Janus-Pro-7B" in listed
    assert main(["download", "nothing-like-it", "--to", str(root)]) == 2
    assert "not a known release" in capsys.readouterr().err


def test_lanterns_drafters_are_offered_by_the_drafter_loader_and_download_into_heads_it_loads(
        monkeypatch, tmp_path):
    """LANTERN's released heads are drafter releases: the Load Drafter lists them (the
    model loader does not), and a downloaded one drafts for its target."""
    from spec_ar.loaders import llamagen
    from spec_ar.loaders.detect import load_drafter

    from .checkpoints import write_lantern_head, write_t5

    name = "LANTERN-drafter-LlamaGen-t2i-XL-256"
    root = tmp_path / "models"
    assert downloads.PREFIX + name in downloads.missing(root, "drafter")
    assert downloads.PREFIX + name not in downloads.missing(root) + downloads.missing(root, "text encoder")
    head = write_lantern_head(tmp_path / "head", hidden=128, heads=2, vocab=1024)
    repo = {p.name: p.read_bytes() for p in head.iterdir()} | {"generation_config.json": b"{}"}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeHub({"jadohu/llamagen_drafter": repo}) as hub:
        folder = downloads.download(name, root, endpoint=hub.url)
    assert on_disk(folder) == ["config.json", "pytorch_model.bin", RECORD]  # what the loader reads
    gpt = write_gpt(tmp_path / "t2i.pt", random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=1))
    model = llamagen.load(gpt, write_vq(tmp_path / "vq.pt"), write_t5(tmp_path / "t5"), resolution=256)
    source = load_drafter(folder, model)
    assert source.name and source.head is not None


def test_the_docs_list_every_release_as_the_table_declares_it():
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    for r in downloads.RELEASES.values():
        assert f"| `{r.name}` | {', '.join(s.repo for s in r.sources)} | {r.what} |" in text, r.name
