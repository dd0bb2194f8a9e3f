"""VM images: recipes under images/, baked with mmdebstrap into a content-addressed cache."""
