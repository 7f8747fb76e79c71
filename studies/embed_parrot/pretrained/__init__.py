"""Embed Parrot with a pretrained decoder: reports/embed_parrot/pretrained/."""
