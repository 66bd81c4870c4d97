"""Reef's learning recipes: one folder per recipe, its `recipe.py` holds the Recipe class."""
