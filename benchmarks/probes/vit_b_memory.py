"""Child of section 6 (`benchmarks.vit_b.vit_b_memory`): the ViT-B/16-sized `ENCODING` model
stage by stage (`benchmarks.vit_b.VIT_B_MEMORY_STAGES`, in order). At each stage it collects
garbage, prints the stage's name and waits for a line on stdin while the parent reads VmRSS /
VmHWM from /proc/<pid>/status.

    python -m benchmarks.probes.vit_b_memory ENCODING
"""
import gc
import pickle
import sys

from benchmarks.vit_b import vit_b_checkpoint, vit_b_new_image
from vitpe_core.gallery import gallery_ids


def stage(name: str) -> None:
    gc.collect()
    print(name, flush=True)
    sys.stdin.readline()


def main(encoding: str) -> None:
    stage("imported")
    ckpt = vit_b_checkpoint(encoding)
    stage("model")
    tr, stats, _ = vit_b_new_image(ckpt, gallery_ids()[0], (7, 7))
    stage("trace")
    blob = pickle.dumps(tr)                   # st.cache_data keeps these bytes; a rerun unpickles its own copy
    del tr
    copy = pickle.loads(blob)  # noqa: F841   (held while the parent reads the memory)
    stage("cached")


if __name__ == "__main__":
    main(sys.argv[1])
