"""Every report's index.html in one .tar.xz: each page inlines the same plotly.js (4.6 MB), so an LZMA2
dictionary larger than a page stores it about once (9 pages: ~2 MB, where tar.gz gives ~15 MB).
Usage: pack_html.py RUNS_DIR OUT.tar.xz [LIMIT_BYTES]; pages beyond the limit (golden reports first) are left out.
"""
import lzma
import sys
import tarfile
from pathlib import Path

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
limit = int(sys.argv[3]) if len(sys.argv) > 3 else 15 << 20
pages = sorted(runs.rglob("index.html"), key=lambda p: ("report-golden" in str(p), str(p)))
FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 1, "dict_size": 32 << 20}]


def write(selected):
    with lzma.open(out, "wb", format=lzma.FORMAT_XZ, filters=FILTERS) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        for page in selected:
            tar.add(page, arcname=str(page.relative_to(runs)))
    return out.stat().st_size


while pages:
    size = write(pages)
    if size <= limit:
        print(f"html: {len(pages)} page(s), {size} bytes -> {out.name}")
        break
    print(f"html: {size} bytes > {limit}: leaving out {pages[-1].relative_to(runs)}")
    pages = pages[:-1]
else:
    out.unlink(missing_ok=True)
