"""`python -m model.train ...`: train a toy model (the code: model/toy/train.py)."""

from model.toy.train import main

if __name__ == "__main__":
    main()
