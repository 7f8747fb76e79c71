"""Studies of FILM's bag of words: reports/film_bag/."""
