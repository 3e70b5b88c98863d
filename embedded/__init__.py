"""The small text-to-image model shipped with the pack: its definition (recipe, text
encoder), its world (procedural images and their prompts), its quality judge, weights
and prompt list.  What trains, demonstrates and evaluates it is ``embedded_tools/``."""
