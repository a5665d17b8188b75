"""The defaults that ``vit bench --help`` shows and the suites use: standard library only, so that the command
line reads them before torch is imported."""

RECIPE_VARIANTS = (
    "baseline",
    "qk_norm",
    "layer_scale",
    "z_loss",
    "beta2_095",
    "warmup_3x",
    "qk_norm+z_loss+beta2_095",
)
"""The recipe suite's variants: changes of :data:`vit.bench.recipe_suite.CHANGES` joined by ``+``."""
RECIPE_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
"""The recipe suite's peak learning rates."""
EXPLORER_CASES = ("cifar10_cpu", "vit_small_patch16_224")
"""The explorer suite's cases, the keys of :data:`vit.bench.explorer_suite.CASES`."""
