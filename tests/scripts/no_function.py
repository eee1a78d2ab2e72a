def train(run):
    pass
