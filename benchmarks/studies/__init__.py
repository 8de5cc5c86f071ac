"""Accuracy studies: the OFU paper's error sources reproduced with the simulated fleet and the math."""
