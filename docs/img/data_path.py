"""Draws docs/img/data_path.png: the path of one tensor that crosses a task boundary.

    python docs/img/data_path.py          # rewrites docs/img/data_path.png (matplotlib)

Top: what happens once, when TensorFlow instantiates a multi-task function (pass -> plan ->
channel). Bottom: what happens every step (one-sided write -> signal -> op output).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_path.png")

ONCE = "#e8f0fb"    # instantiation band
STEP = "#eef7ea"    # step band
BOX = "#ffffff"
EDGE = "#37474f"
ACCENT = "#1565c0"
SIGNAL = "#c62828"


def box(ax, x, y, w, h, title, body, face=BOX, edge=EDGE, num=None):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=face, ec=edge, lw=1.3))
    ax.text(x + w / 2, y + h - 0.2, title, ha="center", va="top", fontsize=10.5,
            fontweight="bold", color=EDGE)
    ax.text(x + w / 2, y + h - 0.55, body, ha="center", va="top", fontsize=8.3, color="#263238",
            linespacing=1.35)
    if num is not None:
        badge(ax, x + 0.05, y + h - 0.05, num)


def badge(ax, x, y, num, color=ACCENT):
    ax.add_patch(plt.Circle((x, y), 0.16, fc=color, ec="none", zorder=5))
    ax.text(x, y, str(num), ha="center", va="center", fontsize=9, color="white",
            fontweight="bold", zorder=6)


def arrow(ax, start, end, color=EDGE, style="-|>", lw=1.6, ls="-", rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14, color=color,
                                 lw=lw, linestyle=ls, connectionstyle=f"arc3,rad={rad}",
                                 zorder=4))


def main():
    fig, ax = plt.subplots(figsize=(13, 7.6))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 7.6)
    ax.axis("off")

    # Bands.
    ax.add_patch(FancyBboxPatch((0.1, 5.0), 12.8, 2.5, boxstyle="round,pad=0,rounding_size=0.1",
                                fc=ONCE, ec="none"))
    ax.add_patch(FancyBboxPatch((0.1, 0.05), 12.8, 4.8, boxstyle="round,pad=0,rounding_size=0.1",
                                fc=STEP, ec="none"))
    ax.text(0.3, 7.38, "Once, when TensorFlow instantiates a multi-task function", fontsize=11.5,
            fontweight="bold", va="top", color="#0d47a1")
    ax.text(0.3, 4.72, "Every step", fontsize=11.5, fontweight="bold", va="top",
            color="#1b5e20")

    # Instantiation: pass -> plan -> channel.
    w, h, y = 3.75, 1.75, 5.2
    box(ax, 0.35, y, w, h, "pass",
        "TF partitions the function per task;\n"
        "rdmadev's POST_PARTITIONING pass\n"
        "collects every cross-task\n_Send/_Recv pair and its shape",
        num=1)
    box(ax, 4.6, y, w, h, "plan",
        "graph_pass plans one channel per\n"
        "tensor (small ones share a bundle):\n"
        "its region on the receiving task,\n"
        "slots, layout, zero-copy or copy",
        num=2)
    box(ax, 8.85, y, w, h, "channel",
        "the receiver allocates and registers the\n"
        "ring as planned and hands its descriptor\n"
        "to the sender (one control round trip\n"
        "per task pair); the pass swaps the pair\n"
        "for RdmadevSend / RdmadevRecv",
        num=3)
    arrow(ax, (0.35 + w, y + h / 2), (4.6, y + h / 2))
    arrow(ax, (4.6 + w, y + h / 2), (8.85, y + h / 2))

    # Step: sending task | receiving task.
    cy, ch = 0.95, 2.95
    ax.add_patch(FancyBboxPatch((0.35, cy), 3.25, ch, boxstyle="round,pad=0,rounding_size=0.1",
                                fc="#fafafa", ec="#90a4ae", lw=1.0, ls="--"))
    ax.text(0.5, cy + ch - 0.12, "sending task", fontsize=9.5, style="italic", va="top",
            color="#455a64")
    ax.add_patch(FancyBboxPatch((5.25, cy), 7.4, ch, boxstyle="round,pad=0,rounding_size=0.1",
                                fc="#fafafa", ec="#90a4ae", lw=1.0, ls="--"))
    ax.text(5.4, cy + ch - 0.12, "receiving task", fontsize=9.5, style="italic", va="top",
            color="#455a64")

    box(ax, 0.55, 1.2, 2.85, 2.05, "RdmadevSend",
        "the producer's tensor, in\nTF's memory: no RPC, no\nserialization, no rendezvous")

    # The ring: one slot = 64-byte header (sequence word, length) + payload.
    rx, ry, rh = 5.5, 1.7, 1.0
    ax.add_patch(plt.Rectangle((rx, ry), 0.75, rh, fc="#ffebee", ec=EDGE, lw=1.2))
    ax.text(rx + 0.375, ry + rh / 2, "seq\nlen", ha="center", va="center", fontsize=8.5,
            color=SIGNAL, fontweight="bold")
    ax.add_patch(plt.Rectangle((rx + 0.75, ry), 2.25, rh, fc="#e3f2fd", ec=EDGE, lw=1.2))
    ax.text(rx + 1.875, ry + rh / 2, "payload:\nthe tensor's bytes", ha="center", va="center",
            fontsize=8.5, color=ACCENT)
    ax.text(rx + 1.5, ry - 0.12, "registered ring (the planned region)", ha="center",
            va="top", fontsize=9, color=EDGE, fontweight="bold")
    ax.text(rx + 1.5, ry - 0.42, "a slot: 64-byte header + payload", ha="center", va="top",
            fontsize=7.8, color="#546e7a")

    box(ax, 9.5, 1.2, 2.95, 2.05, "RdmadevRecv",
        "waits for the sequence word\n(a deadline or a dead peer\nis an error, never a hang);\n"
        "outputs the slot itself\n(zero-copy) or a copy")

    # 4: one-sided write of the payload, 5: the signal after it, 6: the op's output.
    arrow(ax, (3.4, 2.85), (rx + 1.6, ry + rh), color=ACCENT, lw=2.2, rad=-0.3)
    badge(ax, 3.85, 3.62, 4)
    ax.text(4.05, 3.62, "one-sided\nwrite", fontsize=8.8, color=ACCENT, fontweight="bold",
            va="center")
    arrow(ax, (3.4, 1.6), (rx, ry + 0.3), color=SIGNAL, lw=2.0, rad=0.1)
    badge(ax, 3.85, 1.25, 5, color=SIGNAL)
    ax.text(4.05, 1.25, "signal: the\nsequence word,\nafter the payload", fontsize=8.2,
            color=SIGNAL, va="center")
    arrow(ax, (rx + 3.0, ry + rh / 2), (9.5, ry + rh / 2), color="#2e7d32", lw=2.2)
    badge(ax, 9.0, ry + rh / 2 + 0.4, 6, color="#2e7d32")
    ax.text(9.0, ry + rh / 2 + 0.65, "op output", fontsize=8.8, color="#2e7d32",
            fontweight="bold", ha="center", va="bottom")
    # Credit back to the sender once TF frees the tensor.
    ax.add_patch(FancyArrowPatch((10.95, 1.2), (1.95, 1.2), arrowstyle="-|>", mutation_scale=14,
                                 color="#78909c", lw=1.2, linestyle="--",
                                 connectionstyle="bar,fraction=-0.05", zorder=4))
    ax.text(6.5, 0.42, "credit back to the sender once the slot is free (an RDMA write, a store "
            "or a frame)", fontsize=7.8, color="#546e7a", ha="center")

    # The channel set up in (3) is the ring every step writes into.
    arrow(ax, (10.7, 5.2), (rx + 2.6, ry + rh + 0.05), color="#0d47a1", lw=1.2, ls=":", rad=0.1)

    ax.text(6.5, 0.15, "fabrics: verbs (RDMA WRITE), shm (memcpy into the peer's mapping), "
            "tcp (a receiver thread recv()s into the region)", fontsize=7.8, color="#546e7a",
            ha="center")

    fig.savefig(OUT, dpi=110, bbox_inches="tight", facecolor="white")
    print(OUT)


if __name__ == "__main__":
    main()
