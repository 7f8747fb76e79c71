"""Privacy attacks on language-model training artefacts.

Modules: FILM (`bag_of_words`, `beam_search`, `reorder`, `film`), GBoard
(`gboard`), differential score/rank (`differential`), embedding inversion
(`embedding_inversion`, `embed_parrot`), and `metrics`.
"""
