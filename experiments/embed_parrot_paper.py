"""Wan et al. 2024's numbers (Llama2-7B) that the Embed Parrot report
prints beside ours: BEI/HEI by layer (Table 2), Embed Parrot across
corpora (Table 4), by length (Tables 5 and 8) and on defended hidden states
(Table 6).
"""

from __future__ import annotations

# Wan et al. 2024, Llama2-7B (32 layers), in %. Table 2: BEI/HEI by layer.
PAPER_LAYERS = ('0', '5', '10', '15', '20', '25', '30', 'last')
PAPER_TABLE2 = {
  'bei': {
    'f1': (0.17, 1.98, 2.46, 3.25, 13.10, 18.10, 20.41, 23.01),
    'rouge1': (0.33, 1.71, 1.75, 3.20, 9.33, 13.34, 16.66, 18.23),
    'rougeL': (0.33, 1.68, 1.69, 3.04, 8.57, 12.19, 15.69, 17.59),
    'sbert': (3.00, 2.31, 2.99, 6.62, 22.61, 30.95, 22.30, 32.41),
  },
  'hei': {
    'f1': (85.07, 73.44, 65.39, 61.73, 53.50, 39.30, 26.08, 16.67),
    'rouge1': (65.22, 58.93, 53.09, 50.11, 44.38, 34.39, 26.02, 19.51),
    'rougeL': (65.23, 58.95, 53.07, 50.04, 44.40, 34.37, 25.95, 19.13),
    'sbert': (90.15, 84.19, 80.27, 77.75, 72.65, 61.01, 50.48, 25.11),
  },
}
# Table 4, Llama2-7B layer 30, EP trained on fingpt-sentiment.
PAPER_TABLE4 = {
  'fingpt-sentiment (train distribution)': {
    'ep': dict(rouge1=67.30, rougeL=67.23, f1=61.69, sbert=71.47),
    'ep+ppl': dict(rouge1=66.28, rougeL=66.21, f1=60.73, sbert=70.91),
  },
  'fingpt-fiqa_qa': {
    'ep': dict(rouge1=65.99, rougeL=65.97, f1=62.48, sbert=68.85),
    'ep+ppl': dict(rouge1=64.98, rougeL=64.96, f1=61.42, sbert=67.70),
  },
  'wikitext': {
    'ep': dict(rouge1=66.03, rougeL=65.84, f1=63.55, sbert=60.46),
    'ep+ppl': dict(rouge1=65.45, rougeL=65.24, f1=62.93, sbert=60.26),
  },
}
# Table 5 (fingpt-sentiment) and Table 8 (wikitext): Llama2-7B EP by length.
PAPER_TABLE5 = {
  '1-8': dict(rouge1=67.23, rougeL=67.23, f1=66.49, sbert=74.28),
  '8-16': dict(rouge1=68.57, rougeL=68.55, f1=65.64, sbert=71.29),
  '16-32': dict(rouge1=66.78, rougeL=66.74, f1=61.80, sbert=70.91),
  '32-64': dict(rouge1=67.33, rougeL=67.25, f1=60.18, sbert=71.52),
  '64-128': dict(rouge1=68.59, rougeL=68.39, f1=63.07, sbert=75.07),
  '128-256': dict(rouge1=64.81, rougeL=64.24, f1=59.32, sbert=74.86),
}
PAPER_TABLE8 = {
  '1-8': dict(rouge1=98.58, rougeL=98.58, f1=98.58, sbert=98.87),
  '8-16': dict(rouge1=47.69, rougeL=47.69, f1=47.11, sbert=52.53),
  '16-32': dict(rouge1=49.78, rougeL=49.71, f1=47.40, sbert=48.19),
  '32-64': dict(rouge1=50.66, rougeL=50.61, f1=46.26, sbert=40.90),
  '64-128': dict(rouge1=48.29, rougeL=48.00, f1=43.16, sbert=33.84),
  '128-256': dict(rouge1=49.35, rougeL=48.86, f1=43.91, sbert=33.14),
}
# Table 6: EP on defended Llama2-7B hidden states; PPL origin/defense.
PAPER_TABLE6 = {
  '0': dict(rouge1=8.96, rougeL=8.93, f1=3.21, sbert=11.62, ppl=(5.44, 8.85)),
  '30': dict(
    rouge1=16.48, rougeL=16.00, f1=10.19, sbert=23.51, ppl=(5.44, 9.13)
  ),
}
