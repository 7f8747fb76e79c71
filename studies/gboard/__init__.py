"""Studies of the GBoard attack: reports/gboard/."""
