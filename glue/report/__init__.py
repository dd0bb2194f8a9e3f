"""glue report / compare / budget: see and judge a run (plots, evaluation, resources and cost)."""
