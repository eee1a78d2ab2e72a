
raise RuntimeError("this script is broken at import")
