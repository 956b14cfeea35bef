"""The drafter kinds, one package each (eagle3, p_eagle, dflash): a module-level KIND (eyas.draft.kinds.Drafter)
naming its model, objective, proposer and export tables. Found by name through eyas.draft.kinds.PACKAGES, so
the generic stages (train, decode, export), which these packages build on, never import them."""
