"""fleetpatch: carry local fixes to the inference engine on a GPU fleet and prove they run."""

__version__ = "0.1.0"
