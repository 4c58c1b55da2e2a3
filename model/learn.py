"""`python -m model.learn ...`: train the /learn page's recorded run (the code: model/toy/learn.py)."""

from model.toy.learn import main

if __name__ == "__main__":
    main()
