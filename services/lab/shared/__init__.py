"""What every trainer and measure of the lab shares: the training run, rows, pairs, mining, metrics, stages."""
