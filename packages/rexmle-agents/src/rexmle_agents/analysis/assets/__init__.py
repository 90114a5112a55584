"""Package data of the capability analysis: rubrics, the judge's prompts, the labelled example runs."""
