"""FILM's bag of words under client defenses: reports/film_bag/defenses/."""
