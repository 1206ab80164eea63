"""The course's exercises: five functions the engine really calls, for you to write.

Each exNN_*.py holds one exercise: what to implement, the contract, hints, the notebook it belongs
to, and stubs that raise NotImplementedError. exercises/solutions/ holds worked answers (look
after you tried). exercises/checks.py holds the checks every implementation must pass.

    python -m exercises                       # check your code (all five), one line each
    python -m exercises sampling              # one exercise, with the failing check's message
    python -m exercises --impl solutions      # the same checks against the solutions

Run the real engine on your code (minillm/exercises.py is the switch):

    from minillm import LLM, exercises
    with exercises.use("learner", only=["sampling"]):
        llm = LLM()
"""
