"""Studies of DAGER and the FILM-DAGER hybrid: reports/dager/."""
