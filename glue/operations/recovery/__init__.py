"""Operations that move or test a run across VMs: recover, drill, advise, and the demo that strings them."""
