"""Framework trainers searched as they are: each module maps a Config onto one framework's own
settings and counts its steps on the Run. autofit imports none of them unless asked."""
