"""Models on first use, through the real huggingface_hub client against a local server
that serves files the way the hub does (tests/fake_hub.py): the first use downloads
and renders, an interrupted file resumes, a damaged file is caught and not used,
offline and gated each give one clear error, and the server keeps serving."""
from __future__ import annotations

import pathlib

import pytest

from spec_ar.loaders import downloads
from spec_ar.loaders.downloads import DownloadError

from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_vq
from .fake_hub import FakeHub

REPO = "FoundationVision/LlamaGen"
NAME = "LlamaGen-c2i-B-256"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("release")
    gpt = write_gpt(d / "c2i_B_256.pt", random_gpt(tiny_gpt_spec("c2i"), seed=2))
    vq = write_vq(d / "vq_ds16_c2i.pt")
    # the repository holds more than the release needs: only its files are fetched
    return {"c2i_B_256.pt": gpt.read_bytes(), "vq_ds16_c2i.pt": vq.read_bytes(), "c2i_XXL_384.pt": b"x" * 1000}


@pytest.fixture()
def hub(files, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token or cache of the user's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub({REPO: dict(files)}) as server:
        yield server


def test_first_use_downloads_the_release_and_it_renders(hub, tmp_path, files):
    from spec_ar.loaders.detect import load_model
    from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

    root = tmp_path / "models" / "spec_ar"
    assert downloads.PREFIX + NAME in downloads.missing(root)
    seen = []
    folder = downloads.download(NAME, root, endpoint=hub.url, progress=lambda done, total: seen.append(done))
    assert folder == root / NAME
    assert sorted(p.name for p in folder.iterdir()) == ["c2i_B_256.pt", "vq_ds16_c2i.pt"]  # nothing else, no .cache
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


def test_an_interrupted_file_resumes_where_it_stopped(hub, tmp_path):
    import io

    import torch

    # a file larger than huggingface_hub's 10 MB download chunk, cut after the first chunk arrived
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.arange(3_300_000, dtype=torch.float32)}}, buffer)
    big = buffer.getvalue()
    hub.repos[REPO]["c2i_B_256.pt"] = big
    hub.cut["c2i_B_256.pt"] = 10 * 2**20 + 12345
    root = tmp_path / "models"
    try:
        downloads.download(NAME, root, endpoint=hub.url)
    except DownloadError as err:  # the client gave up: the next run resumes from the kept part
        assert "run again" in str(err)
        downloads.download(NAME, root, endpoint=hub.url)
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.endswith("/c2i_B_256.pt") and r]
    assert ranges == [f"bytes={10 * 2**20}-"], hub.requests  # the arrived chunk is not fetched again
    assert (root / NAME / "c2i_B_256.pt").read_bytes() == big


def test_a_damaged_file_is_caught_and_not_used(hub, tmp_path, files):
    root = tmp_path / "models"
    hub.repos[REPO]["c2i_B_256.pt"] = files["c2i_B_256.pt"][: len(files["c2i_B_256.pt"]) // 2]  # a broken upload
    with pytest.raises(DownloadError, match=r"LlamaGen-c2i-B-256: c2i_B_256.pt arrived damaged .* run again"):
        downloads.download(NAME, root, endpoint=hub.url)
    assert not (root / NAME).exists()  # no folder a later run would take as complete
    assert not (root / f"{NAME}.partial" / "c2i_B_256.pt").exists()
    hub.repos[REPO]["c2i_B_256.pt"] = files["c2i_B_256.pt"]  # mended on the hub: the next run completes
    assert (downloads.download(NAME, root, endpoint=hub.url) / "c2i_B_256.pt").read_bytes() == files["c2i_B_256.pt"]


def test_offline_is_one_clear_error(hub, tmp_path, monkeypatch):
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


def test_an_unknown_release_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(DownloadError, match="not a known release; known: LlamaGen-c2i-B-256, "):
        downloads.download("Stable-Diffusion", tmp_path)


def test_every_release_names_its_files_and_families_the_loaders_know():
    from spec_ar.loaders.detect import BY_NAME

    for release in downloads.RELEASES.values():
        assert release.sources and all(s.repo.count("/") == 1 and s.files for s in release.sources)
        assert release.family in BY_NAME or release.family in ("t5", "drafter"), release


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
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "pytorch_model.bin"]  # what the loader reads
    gpt = write_gpt(tmp_path / "t2i.pt", random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=1))
    model = llamagen.load(gpt, write_vq(tmp_path / "vq.pt"), write_t5(tmp_path / "t5"), resolution=256)
    source = load_drafter(folder, model)
    assert source.name and source.head is not None


def test_the_docs_list_every_release_as_the_table_declares_it():
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    for r in downloads.RELEASES.values():
        assert f"| `{r.name}` | {', '.join(s.repo for s in r.sources)} | {r.what} |" in text, r.name
