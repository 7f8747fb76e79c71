"""The noisy regime's word detectors: reports/gboard/noise_detectors/."""
