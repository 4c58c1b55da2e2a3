"""`python -m model.prenorm ...`: post-LN vs pre-LN, with and without warmup (the code: model/toy/prenorm.py)."""

from model.toy.prenorm import main

if __name__ == "__main__":
    main()
