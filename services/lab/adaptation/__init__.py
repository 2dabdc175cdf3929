"""`dpr adapt`: the towers adapted to an unlabelled corpus (stages, mining stage, teacher)."""
