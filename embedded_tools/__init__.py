"""The programs that train, demonstrate and evaluate the shipped model (``embedded/``):
``spec-ar train-embedded``, ``spec-ar demo``, ``spec-ar evaluate``, and the quality loop
evaluation and bench share.  They load the model through ``loaders/``, which rebuilds
it from ``embedded/``'s definition: one layer above the loaders, the definition one below."""
