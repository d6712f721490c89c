"""Routing by agreement as a picture: one row per image.

:func:`routing_figure` for children on a grid: the input, where the winner's support comes
from, its couplings per iteration and the runner-up's; :func:`routing_types_figure` for a
1x1 grid: (classes x types) coupling matrices. Couplings use a diverging scale around 1/J."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from capsnet.figures.common import (
    RIGHT_COLOR,
    WRONG_COLOR,
    class_label,
    draw_image,
    save_figure,
    show_image,
)

PANEL_INCHES = 1.9  # side of one panel
COUPLING_CMAP = "RdBu_r"  # diverging around the uniform coupling 1/J
SUPPORT_CMAP = "magma"
SUPPORT_ALPHA = 0.85  # opacity of the strongest support cell over the input
INK_LEVEL = 128  # grey level of the digit outline drawn over the coupling maps
OUTLINE_COLOR = "0.25"
GRID_EDGE_COLOR = "0.6"  # thin frame around the primary grid on the coupling maps
FIELD_COLOR = "tab:cyan"  # dashed square: the receptive field of the strongest cell
MIN_SPREAD = 1e-6  # coupling scale half-width when every coupling is exactly 1/J


def grey_of(image: np.ndarray) -> np.ndarray:
    """(H, W) or (H, W, 3) uint8 -> (H, W) float brightness (the mean over channels)."""
    return image.astype(np.float32) if image.ndim == 2 else image.mean(axis=-1)


def grid_extent(centres: Sequence[float]) -> tuple[float, float, float, float]:
    """imshow extent putting grid cell g on its receptive-field centre ``centres[g]``."""
    step = centres[1] - centres[0] if len(centres) > 1 else 1.0
    low, high = centres[0] - step / 2, centres[-1] + step / 2
    return (low, high, high, low)


def _frame(ax, image: np.ndarray) -> None:
    """Limits of ``ax`` on the image (H, W[, 3]) whatever else is drawn; no ticks."""
    H, W = image.shape[:2]
    ax.set_xlim(-0.5, W - 0.5)
    ax.set_ylim(H - 0.5, -0.5)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_coupling_map(ax, coupling: np.ndarray, grey: np.ndarray, centres: Sequence[float],
                      norm: Normalize) -> None:
    """A (G, G) coupling map at the receptive-field centres, the digit outlined on top."""
    extent = grid_extent(centres)
    ax.imshow(coupling, cmap=COUPLING_CMAP, norm=norm, extent=extent, interpolation="nearest")
    left, right, bottom, top = extent
    ax.add_patch(Rectangle((left, top), right - left, bottom - top, fill=False,
                           linewidth=0.5, edgecolor=GRID_EDGE_COLOR))
    if grey.max() > INK_LEVEL:
        ax.contour(grey, levels=[INK_LEVEL], colors=OUTLINE_COLOR, linewidths=0.6)
    _frame(ax, grey)


def draw_support_overlay(ax, image: np.ndarray, support: np.ndarray, centres: Sequence[float],
                         field: int, norm: Normalize) -> None:
    """The input with a (G, G) support map over it and the strongest cell's field dashed."""
    draw_image(ax, image)
    rgba = colormaps[SUPPORT_CMAP](norm(support))  # (G, G, 4)
    rgba[..., 3] = SUPPORT_ALPHA * np.clip(norm(support), 0, 1)
    ax.imshow(rgba, extent=grid_extent(centres), interpolation="nearest")
    row, col = np.unravel_index(int(np.argmax(support)), support.shape)
    half = field / 2
    ax.add_patch(Rectangle((centres[col] - half, centres[row] - half), field, field, fill=False,
                           linestyle="--", linewidth=0.8, edgecolor=FIELD_COLOR))
    _frame(ax, image)


def routing_figure(images: Sequence[np.ndarray], coupling_maps: np.ndarray,
                   support_maps: np.ndarray, scores: np.ndarray, titles: Sequence[str],
                   centres: Sequence[float], field: int, path: str | os.PathLike,
                   wrong: Sequence[bool] | None = None,
                   class_names: Sequence[str] | None = None, symbol: str = "c",
                   support_label: str = "|c\u00b7\u00fb|", children: str = "primary") -> Path:
    """One row per image: images N of (H, W[, 3]) uint8; coupling_maps, support_maps
    (N, R, J, G, G) from :class:`capsnet.routing_trace.RoutingTrace`; scores (N, J); titles
    (red where ``wrong``); centres (G,) and field of the children's grid."""
    N, R, J = coupling_maps.shape[:3]
    first = coupling_maps[:, 0]  # (N, J, G, G) iteration 1's couplings
    first_uniform = bool(np.ptp(first) == 0)  # dynamic and inverted-attention routing: 1/J
    uniform = float(first[0, 0].mean()) if first_uniform else 1.0 / J
    columns = 2 + R + 1  # input, support, R coupling iterations, runner-up
    fig = Figure(figsize=(columns * PANEL_INCHES + 1.5, N * PANEL_INCHES + 0.6),
                 layout="constrained")
    axes = fig.subplots(N, columns, squeeze=False)
    for n in range(N):
        order = np.argsort(-scores[n])
        winner, second = int(order[0]), int(order[1]) if J > 1 else int(order[0])
        winner_name = class_label(winner, class_names)
        grey = grey_of(images[n])
        row = axes[n]
        show_image(row[0], images[n], titles[n], _title_color(wrong, n))

        support = support_maps[n, -1, winner]  # (G, G)
        support_norm = Normalize(0.0, max(float(support.max()), MIN_SPREAD))
        draw_support_overlay(row[1], images[n], support, centres, field, support_norm)
        row[1].set_title(f"support for {winner_name}: {support_label} (iter. {R})", fontsize=8)
        _colorbar(fig, support_norm, SUPPORT_CMAP, row[1], "sum over types", 0.05, 0.02)

        shown = [coupling_maps[n, r, winner] for r in range(R)] + [coupling_maps[n, -1, second]]
        spread = max(max(float(np.abs(m - uniform).max()) for m in shown), MIN_SPREAD)
        norm = Normalize(uniform - spread, uniform + spread)
        for r, ax in enumerate(row[2:2 + R]):
            draw_coupling_map(ax, shown[r], grey, centres, norm)
            note = " (uniform)" if r == 0 and first_uniform else ""
            ax.set_title(f"{symbol} to {winner_name}, iteration {r + 1}{note}", fontsize=8)
            ax.set_xlabel(f"mean {shown[r].mean():.4f}", fontsize=7)
        draw_coupling_map(row[-1], shown[-1], grey, centres, norm)
        row[-1].set_title(f"{symbol} to runner-up {class_label(second, class_names)}, iter. {R}",
                          fontsize=8)
        row[-1].set_xlabel(f"mean {shown[-1].mean():.4f}", fontsize=7)
        _colorbar(fig, norm, COUPLING_CMAP, row[2:],
                  f"coupling {symbol}, mean over types (1/{J} = uniform)", 0.02, 0.01)
    return save_figure(fig, path, "Routing by agreement: where the winning class capsule's input "
                       f"comes from on the {children}-capsule grid (cells at their "
                       "receptive-field centres; dashed: the strongest cell's receptive field)")


def routing_types_figure(images: Sequence[np.ndarray], type_maps: np.ndarray,
                         type_support: np.ndarray, scores: np.ndarray, titles: Sequence[str],
                         path: str | os.PathLike, wrong: Sequence[bool] | None = None,
                         class_names: Sequence[str] | None = None, symbol: str = "c",
                         support_label: str = "|c\u00b7\u00fb|",
                         children: str = "primary") -> Path:
    """The routing per capsule type for a 1x1 grid: per image the input, each iteration's
    (J x T) couplings and the last support per type; type_maps, type_support (N, R, J, T)."""
    N, R, J, T = type_maps.shape
    columns = 1 + R + 1  # input, R coupling matrices, support
    matrix_inches = max(PANEL_INCHES, PANEL_INCHES * T / J)
    fig = Figure(figsize=(PANEL_INCHES + (R + 1) * matrix_inches + 1.5,
                          N * PANEL_INCHES + 0.6), layout="constrained")
    axes = fig.subplots(N, columns, squeeze=False,
                        width_ratios=[PANEL_INCHES] + [matrix_inches] * (R + 1))
    names = [class_label(j, class_names) for j in range(J)]
    for n in range(N):
        winner = int(np.argmax(scores[n]))
        row = axes[n]
        show_image(row[0], images[n], titles[n], _title_color(wrong, n))
        spread = max(float(np.abs(type_maps[n] - 1.0 / J).max()), MIN_SPREAD)
        norm = Normalize(1.0 / J - spread, 1.0 / J + spread)
        for r, ax in enumerate(row[1:1 + R]):
            _draw_matrix(ax, type_maps[n, r], COUPLING_CMAP, norm, winner, names)
            ax.set_title(f"{symbol} per type, iteration {r + 1}", fontsize=8)
        _colorbar(fig, norm, COUPLING_CMAP, row[1:1 + R], f"{symbol} (1/{J} = uniform)",
                  0.03, 0.01)
        support = type_support[n, -1]  # (J, T)
        support_norm = Normalize(0.0, max(float(support.max()), MIN_SPREAD))
        _draw_matrix(row[-1], support, SUPPORT_CMAP, support_norm, winner, names)
        row[-1].set_title(f"support {support_label} (iter. {R})", fontsize=8)
        _colorbar(fig, support_norm, SUPPORT_CMAP, row[-1], "sum over positions", 0.05, 0.02)
    return save_figure(fig, path, f"Routing from the {children} capsules (columns: capsule "
                       "types) to the class capsules (rows; framed: the prediction)")


def _colorbar(fig, norm: Normalize, cmap: str, ax, label: str, fraction: float,
              pad: float) -> None:
    """A colour bar of ``norm`` in ``cmap`` beside ``ax`` (or axes), labelled ``label``."""
    bar = fig.colorbar(ScalarMappable(norm, cmap), ax=ax, fraction=fraction, pad=pad)
    bar.ax.tick_params(labelsize=6)
    bar.set_label(label, fontsize=6)


def _draw_matrix(ax, values: np.ndarray, cmap: str, norm: Normalize, winner: int,
                 names: Sequence[str]) -> None:
    """A (J, T) matrix, classes as rows, types as columns, the winner's row framed."""
    J, T = values.shape
    ax.imshow(values, cmap=cmap, norm=norm, interpolation="nearest", aspect="auto")
    ax.add_patch(Rectangle((-0.5, winner - 0.5), T, 1, fill=False, linewidth=1.2,
                           edgecolor=FIELD_COLOR))
    ax.set_yticks(range(J), names, fontsize=6)
    ax.set_xticks(range(T), [str(t) for t in range(T)], fontsize=6)
    ax.set_xlabel("capsule type", fontsize=7)


def _title_color(wrong: Sequence[bool] | None, n: int) -> str:
    return WRONG_COLOR if wrong is not None and wrong[n] else RIGHT_COLOR
