"""Named, fixed problem lists. Every plot and table in the series uses one of these.

* ``quick``: small fp32 problems, the whole suite runs in well under two minutes on a laptop GPU;
* ``seed``: single-image CHW fp32 "same" convolutions like the seed notebook's benchmark
  (input channels 1..512, filters 1/3/5/9, images 64..1024), fixed instead of sampled;
* ``resnet50``: the 19 distinct fprop layers of ResNet-50 (its convolutions, duplicates
  removed), at N=32 and N=256;
* ``depthwise``: MobileNet-style 3×3 depthwise layers at N=32 (C = K = groups);
* ``edge``: the shapes that break kernels: H != W, sizes that divide no tile, images smaller than
  the tile and the filter, even and non-square filters, uneven stride and padding, C in {1, 3, 45},
  N > 1, cancellation, grids past 65,535, and one problem over 2^31 elements;
* ``outside``: layers of other networks (VGG-16, MobileNet-v1's pointwise layers, U-Net, detector
  heads) and ResNet-50 at N = 1 and 8: the problems no rule of the series was fitted on, where
  day 15 judges its tuner against those rules.
"""

from __future__ import annotations

from dataclasses import replace

from .problem import Conv2dProblem as P


def _same(C: int, K: int, R: int, H: int, W: int | None = None, N: int = 1) -> P:
    return P(N=N, C=C, H=H, W=W or H, K=K, R=R, S=R, padding="same")


def quick() -> list[P]:
    return [
        _same(1, 4, 3, 64),
        _same(3, 16, 3, 128),
        _same(3, 8, 5, 100, 75),
        _same(16, 32, 3, 64, N=2),
        _same(32, 32, 1, 64),
        _same(8, 8, 9, 48),
    ]


def seed() -> list[P]:
    # (C, K, R, H=W); each under ~45 GFLOP so the naive kernel still finishes in milliseconds.
    shapes = [
        (1, 8, 3, 1024), (1, 1, 9, 1024), (3, 16, 3, 512), (3, 64, 5, 1024), (3, 32, 9, 256),
        (8, 32, 5, 512), (16, 16, 9, 1024), (32, 32, 3, 1024), (32, 128, 1, 512), (64, 64, 3, 256),
        (128, 128, 3, 128), (128, 128, 5, 128), (128, 512, 9, 64), (256, 256, 3, 64),
        (512, 128, 1, 128), (512, 512, 3, 64),
    ]
    return [_same(c, k, r, h) for c, k, r, h in shapes]


# (H=W, C, K, R=S, pad, stride), N set by the caller.
RESNET50_LAYERS = [
    (56, 64, 256, 1, 0, 1), (56, 64, 64, 1, 0, 1), (56, 64, 64, 3, 1, 1), (56, 256, 64, 1, 0, 1),
    (56, 256, 512, 1, 0, 2), (56, 256, 128, 1, 0, 2), (28, 128, 128, 3, 1, 1), (28, 128, 512, 1, 0, 1),
    (28, 512, 128, 1, 0, 1), (28, 512, 1024, 1, 0, 2), (28, 512, 256, 1, 0, 2), (14, 256, 256, 3, 1, 1),
    (14, 256, 1024, 1, 0, 1), (14, 1024, 256, 1, 0, 1), (14, 1024, 2048, 1, 0, 2), (14, 1024, 512, 1, 0, 2),
    (7, 512, 512, 3, 1, 1), (7, 512, 2048, 1, 0, 1), (7, 2048, 512, 1, 0, 1),
]


def resnet50(batches: tuple[int, ...] = (32, 256)) -> list[P]:
    return [
        P(N=n, C=c, H=h, W=h, K=k, R=r, S=r, padding=pad, stride=s)
        for n in batches
        for h, c, k, r, pad, s in RESNET50_LAYERS
    ]


# (C = K = groups, H = W, stride)
DEPTHWISE_LAYERS = [
    (32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (384, 14, 1), (576, 14, 1), (960, 7, 1),
]


def depthwise(n: int = 32) -> list[P]:
    return [P(N=n, C=c, H=h, W=h, K=c, R=3, S=3, padding=1, stride=s, groups=c) for c, h, s in DEPTHWISE_LAYERS]


# Problems of the edge suite that need more than ~20 GB of device memory to check.
BIG_ELEMENTS = 2**31


def edge() -> list[P]:
    return [
        _same(3, 5, 3, 37, 53),  # H != W, sizes that divide no tile
        _same(2, 3, 5, 3, 4),  # image smaller than the filter and than any tile
        _same(4, 2, 3, 1, 1),  # a single pixel
        P(N=1, C=3, H=20, W=17, K=4, R=3, S=5, padding=(1, 2)),  # R != S, odd, "same"
        P(N=1, C=2, H=11, W=12, K=3, R=4, S=2, padding=(1, 0)),  # even filters
        P(N=1, C=3, H=19, W=23, K=4, R=3, S=3, padding=1, stride=(2, 1)),  # stride_h != stride_w
        P(N=1, C=3, H=16, W=15, K=4, R=3, S=3, padding=(2, 0)),  # pad_h != pad_w
        P(N=1, C=2, H=9, W=9, K=3, R=3, S=3, padding=3),  # pad >= R/2
        P(N=1, C=3, H=17, W=13, K=5, R=2, S=2, stride=3),  # stride > R
        P(N=1, C=2, H=10, W=10, K=3, R=3, S=3, stride=4),  # (H + 2pad - R) % stride != 0
        P(N=2, C=4, H=15, W=14, K=6, R=3, S=3, padding=2, dilation=2),  # dilation
        P(N=1, C=3, H=13, W=17, K=5, R=3, S=3, padding=(1, 2), dilation=(1, 2)),  # dilation (1, 2): dh and dw apart
        P(N=2, C=8, H=17, W=12, K=9, R=3, S=2, padding=(2, 1), dilation=(2, 1)),  # dilation (2, 1)
        P(N=2, C=6, H=12, W=13, K=6, R=3, S=3, padding=1, groups=3),  # groups
        # grouped, strided and dilated differently per axis
        P(N=2, C=6, H=9, W=14, K=9, R=3, S=5, padding=(1, 2), stride=(2, 3), dilation=(2, 1), groups=3),
        P(N=1, C=3, H=10, W=7, K=6, R=3, S=3, padding=1, groups=3),  # grouped, channel multiplier 2
        P(N=2, C=6, H=13, W=11, K=6, R=3, S=3, padding=1, stride=2, groups=6),  # depthwise, odd non-square, stride 2
        P(N=1, C=5, H=17, W=9, K=5, R=5, S=5, padding=2, groups=5),  # depthwise 5x5
        # depthwise, column stride 3 and column dilation (the general row path of 07_depthwise.cu)
        P(N=1, C=4, H=12, W=19, K=4, R=3, S=3, padding=(1, 2), stride=(1, 3), dilation=(1, 2), groups=4),
        P(N=2, C=3, H=11, W=10, K=3, R=3, S=3, padding=2, dilation=(2, 1), groups=3),  # depthwise, row dilation
        _same(1, 7, 3, 33, 31),  # C = 1, K = 7
        _same(45, 33, 3, 19, 21),  # C = 45, K = 33 (not a multiple of any tile)
        _same(3, 16, 7, 24, 40, N=3),  # N > 1
        _same(64, 8, 3, 8, 8),  # a long reduction on a tiny image
        _same(1, 70000, 3, 8, 8),  # N*K = 70,000 planes: past 65,535 in z
        _same(1, 2, 3, 600_000, 3),  # P = 600,000 rows: past 65,535 blocks in y
        _same(1, 1, 3, 32800, 32800, N=2),  # 2.15e9 elements in x and y: 64-bit offsets
    ]


# (N, C, H, W, K, R, pad, stride) of other networks' layers, for `outside`.
# The backward edge cases of days 14, 18 and 19 (tests/gpu), by name, as Conv2dProblem keyword
# arguments without dtype, layout and op: stride above the filter (dx rows no tap reaches), odd and
# even sizes with stride 2, padding >= R/2 and past the dilated filter, both dilations, C and K off
# the tiles, the 7 x 7 stem, a strided 1 x 1, an even filter; C and K multiples of 8, so that every
# backward variant can claim them.
BACKWARD_EDGES = {
    "stride 3 > 1x1 filter (dx rows no tap reaches)": dict(N=2, C=16, H=10, W=9, K=24, R=1, S=1, stride=3),
    "stride 3 > 2x2 filter": dict(N=2, C=8, H=11, W=13, K=16, R=2, S=2, stride=3, padding=1),
    "odd H, W with stride 2": dict(N=3, C=16, H=13, W=11, K=8, R=3, S=3, stride=2, padding=1),
    "even H, W with stride 2": dict(N=2, C=24, H=14, W=12, K=16, R=3, S=3, stride=2, padding=1),
    "padding >= R/2": dict(N=1, C=16, H=9, W=10, K=16, R=3, S=3, padding=2),
    "padding past the dilated filter": dict(N=1, C=8, H=7, W=6, K=8, R=3, S=2, padding=(3, 2)),
    "dilation (1, 2)": dict(N=2, C=16, H=12, W=15, K=8, R=3, S=3, padding=(1, 2), dilation=(1, 2)),
    "dilation (2, 1), stride (2, 1)": dict(N=2, C=8, H=15, W=12, K=24, R=3, S=2, stride=(2, 1), padding=1,
                                          dilation=(2, 1)),
    "C, K past the tiles": dict(N=2, C=136, H=9, W=9, K=200, R=3, S=3, padding=1),
    "7x7 stride 2 (the stem)": dict(N=2, C=8, H=32, W=30, K=64, R=7, S=7, stride=2, padding=3),
    "strided 1x1, ResNet-style": dict(N=4, C=64, H=28, W=28, K=128, R=1, S=1, stride=2),
    "even filter 4x2, stride (1, 2)": dict(N=2, C=8, H=10, W=11, K=8, R=4, S=2, stride=(1, 2), padding=(1, 0)),
}


OTHER_LAYERS = [
    # VGG-16 at 224 x 224, N = 8: the 3x3 layers of each stage (the first, C = 3, included)
    (8, 3, 224, 224, 64, 3, 1, 1), (8, 64, 224, 224, 64, 3, 1, 1), (8, 64, 112, 112, 128, 3, 1, 1),
    (8, 128, 112, 112, 128, 3, 1, 1), (8, 128, 56, 56, 256, 3, 1, 1), (8, 256, 56, 56, 256, 3, 1, 1),
    (8, 256, 28, 28, 512, 3, 1, 1), (8, 512, 28, 28, 512, 3, 1, 1), (8, 512, 14, 14, 512, 3, 1, 1),
    # MobileNet-v1 at 224 x 224, N = 16: the pointwise (1x1) layers
    (16, 32, 112, 112, 64, 1, 0, 1), (16, 64, 56, 56, 128, 1, 0, 1), (16, 128, 56, 56, 128, 1, 0, 1),
    (16, 128, 28, 28, 256, 1, 0, 1), (16, 256, 28, 28, 256, 1, 0, 1), (16, 256, 14, 14, 512, 1, 0, 1),
    (16, 512, 14, 14, 512, 1, 0, 1), (16, 512, 7, 7, 1024, 1, 0, 1), (16, 1024, 7, 7, 1024, 1, 0, 1),
    # U-Net at 256 x 256, N = 4: encoder 3x3 layers and a decoder layer after its concatenation
    (4, 64, 256, 256, 64, 3, 1, 1), (4, 128, 128, 128, 128, 3, 1, 1), (4, 256, 64, 64, 256, 3, 1, 1),
    (4, 512, 32, 32, 512, 3, 1, 1), (4, 1024, 16, 16, 1024, 3, 1, 1), (4, 1024, 32, 32, 512, 3, 1, 1),
    # detectors, N = 2: FPN 3x3 at 1/8 and 1/16 of 800 x 1216, a RetinaNet head, a stride-2 downsampling
    (2, 256, 100, 152, 256, 3, 1, 1), (2, 256, 50, 76, 256, 3, 1, 1), (2, 256, 25, 38, 256, 3, 1, 1),
    (8, 128, 104, 104, 256, 3, 1, 2),
]


def outside() -> list[P]:
    other = [P(N=n, C=c, H=h, W=w, K=k, R=r, S=r, padding=pad, stride=s) for n, c, h, w, k, r, pad, s in OTHER_LAYERS]
    return other + resnet50(batches=(1, 8))


SUITES = {"quick": quick, "seed": seed, "resnet50": resnet50, "depthwise": depthwise, "edge": edge,
          "outside": outside}


def suite(name: str, dtype: str | None = None, layout: str | None = None, op: str | None = None) -> list[P]:
    """The problems of suite ``name``, optionally converted to another dtype, layout and/or operation.

    Every suite is defined as fprop problems; ``op="dgrad"`` or ``"wgrad"`` gives the same shapes
    as that operation (names regenerated: "dgrad N32 C64 ...").

    Raises:
        KeyError: unknown suite (the message lists the known ones).
        ValueError: an unknown dtype, layout or op (from `Conv2dProblem`).
    """
    if name not in SUITES:
        raise KeyError(f"no suite {name!r}; known: {', '.join(SUITES)}")
    probs = SUITES[name]()
    if dtype or layout or op:
        probs = [replace(p, dtype=dtype or p.dtype, layout=layout or p.layout, op=op or p.op, name="") for p in probs]
    return probs


def is_big(p: P) -> bool:
    """True for problems with a tensor of 2^31 elements or more (skipped on small GPUs)."""
    return max(p.x_numel, p.y_numel) >= BIG_ELEMENTS
