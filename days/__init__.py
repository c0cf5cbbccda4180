"""The days of the series: one registry module per day (or a small package for a large day).

Importing this package imports every ``dayNN_*`` module in curriculum order, and each registers
its variants with `helpers.variants.register`; `helpers.variants.get` imports it on first use.
A day module imports the harness core (`helpers`), the shared `days.kit`, and an earlier day
only through its public names, where it builds on that day.
"""

import importlib
import pkgutil

DAY_MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("day")))

for _name in DAY_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
