"""Memory the scripts that import it keep between probes in a module of their own, which a persistent
worker cannot put back (it restores the script's own module, not the modules it imports)."""

ONCE: list = []
EVERY_PROBE: list = []
PROBES: list = []
