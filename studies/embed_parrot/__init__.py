"""Studies of embedding inversion (Embed Parrot): reports/embed_parrot/."""
