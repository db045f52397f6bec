"""rgpt-prep: raw text -> GPT-2 BPE tokens -> mosaicml-streaming (MDS) shards with a manifest."""
