"""`dpr train`: the towers' recipe, its rounds and its recipe file; the trainers; blends and soups."""
