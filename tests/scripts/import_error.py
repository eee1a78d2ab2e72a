from autofit import autofit

raise RuntimeError("this script is broken at import")
