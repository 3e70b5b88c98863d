"""Thumbnails for ComfyUI's Templates browser: ``<title>.jpg`` beside ``<title>.json``.

A workflow that runs on the embedded model gets a real render: the workflow is
queued on a ComfyUI server as shipped and its own output images are laid out with
the forward passes its report gives.  A family workflow, whose weights cannot
ship, gets a card saying which model it needs and where the files go.
"""
from __future__ import annotations

import io
import json
import re
import pathlib
import urllib.parse

from PIL import Image, ImageDraw, ImageFont

from .catalog import CATALOG, embedded, title

SIZE = 512
BACKGROUND, INK, MUTED, ACCENT = (24, 26, 31), (236, 236, 236), (150, 156, 168), (86, 156, 214)


def _font(size: int):
    return ImageFont.load_default(size=size)


def _wrap(draw, text: str, font, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if draw.textlength(trial, font=font) <= width or not line:
            line = trial
        else:
            lines.append(line)
            line = word
    return lines + ([line] if line else [])


def family_card(name: str) -> Image.Image:
    """A card for a workflow whose model is not shipped: its title and the files it needs."""
    img = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, SIZE, 8], fill=ACCENT)
    y = 48
    for line in _wrap(d, title(name), _font(34), SIZE - 64):
        d.text((32, y), line, font=_font(34), fill=INK)
        y += 44
    y += 24
    d.text((32, y), "Needs these weights in", font=_font(22), fill=MUTED)
    d.text((32, y + 30), "ComfyUI/models/spec_ar/:", font=_font(22), fill=MUTED)
    y += 76
    for part in re.split(r", (?![^(]*\))", CATALOG[name][1]):  # a comma inside parentheses stays
        for line in _wrap(d, part, _font(22), SIZE - 88):
            d.text((48, y), line, font=_font(22), fill=INK)
            y += 30
        y += 8
    d.text((32, SIZE - 56), "Not included: download the release,", font=_font(18), fill=MUTED)
    d.text((32, SIZE - 32), "then refresh the page.", font=_font(18), fill=MUTED)
    return img


def _view(server, item: dict) -> Image.Image:
    query = urllib.parse.urlencode({k: item[k] for k in ("filename", "subfolder", "type")})
    return Image.open(io.BytesIO(server.get(f"/view?{query}"))).convert("RGB")


def _outputs(entry: dict, node: str) -> dict:
    return entry["outputs"].get(node, {})


def _tile(img: Image.Image, side: int) -> Image.Image:
    return img.resize((side, side), Image.NEAREST if img.width < side else Image.LANCZOS)


def render(server, name: str, api: dict) -> Image.Image:
    """Queue an embedded workflow and lay out what its output nodes show."""
    entry = server.run(api)
    if entry["status"]["status_str"] != "success":
        raise RuntimeError(f"{name}: the workflow failed on the server: {json.dumps(entry['status'])[:2000]}")
    by_class = {}
    for node_id, node in api.items():
        by_class.setdefault(node["class_type"], []).append(node_id)
    img = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
    d = ImageDraw.Draw(img)
    samplers = by_class.get("SpecAR_Sampler", [])
    if len(samplers) > 1 and "SpecAR_ReportPlot" not in by_class:  # two samplers side by side
        previews = by_class["PreviewImage"]
        side = (SIZE - 16 * (len(previews) + 1)) // len(previews)
        for i, node_id in enumerate(previews):
            source = api[node_id]["inputs"]["images"][0]
            inputs = api[source]["inputs"]
            x = 16 + i * (side + 16)
            img.paste(_tile(_view(server, _outputs(entry, node_id)["images"][0]), side), (x, 96))
            d.text((x, 48), inputs["mode"], font=_font(28), fill=INK)
            if "drafter" in inputs:
                d.text((x, 96 + side + 16), "on the draft head", font=_font(22), fill=MUTED)
        return img
    if len(samplers) > 1:  # the comparison: each mode's picture, and the report plot
        previews = by_class["PreviewImage"]
        for i, node_id in enumerate(previews):
            source = api[node_id]["inputs"]["images"][0]
            mode = api[source]["inputs"]["mode"]
            x, y = 16 + (i % 3) * 166, 16 + (i // 3) * 248
            img.paste(_tile(_view(server, _outputs(entry, node_id)["images"][0]), 150), (x, y + 34))
            d.text((x, y + 4), mode, font=_font(24), fill=INK)
        plot = _view(server, _outputs(entry, by_class["SpecAR_ReportPlot"][0])["images"][0])
        plot.thumbnail((150, 200))
        img.paste(plot, (16 + 2 * 166, 16 + 248 + 34))
        d.text((16 + 2 * 166, 16 + 248 + 4), "report", font=_font(24), fill=INK)
        return img
    images = [_view(server, item) for node_id in by_class.get("SaveImage", [])
              for item in _outputs(entry, node_id).get("images", [])]
    if len(images) > 1:  # a prompt list: every prompt's picture
        side = (SIZE - 16 * (len(images) + 1)) // len(images)
        for i, picture in enumerate(images):
            img.paste(_tile(picture, side), (16 + i * (side + 16), 96))
        d.text((16, 32), f"{len(images)} prompts, one queue entry", font=_font(28), fill=INK)
        d.text((16, 96 + side + 24), api[samplers[0]]["inputs"]["mode"] + " on each", font=_font(24), fill=MUTED)
        return img
    img.paste(_tile(images[0], 416), (48, 16))
    report = next((t for node_id in by_class.get("PreviewAny", []) for t in _outputs(entry, node_id).get("text", [])),
                  "")
    first = report.split("\n", 1)[0]  # "sjd: 256 tokens in 45 forwards (...)"
    if " forwards" not in first:
        raise RuntimeError(f"{name}: no forward count in the report {report[:200]!r}")
    d.text((48, 448), first.split(" forwards", 1)[0] + " forwards", font=_font(28), fill=INK)
    return img


def write_all(server, folder: pathlib.Path) -> list[pathlib.Path]:
    written = []
    for name in CATALOG:
        if embedded(name):
            api = json.loads((folder / "api" / f"{name}.json").read_text())
            picture = render(server, name, api)
        else:
            picture = family_card(name)
        path = folder / f"{title(name)}.jpg"
        picture.save(path, "JPEG", quality=88)
        written.append(path)
    return written
