"""What `minillm train-medusa` asks the base model, so that its answers teach the heads.

Medusa heads learn the model's own continuations, so they guess well only in
the kind of text they were trained on: heads trained on Python-manual answers
were right 0.07 of the time on everyday questions. The prompts therefore mix
four kinds of text:

* passages of Python's reference manual (`pydoc_data.topics`, the "calib" half,
  never what `minillm eval ppl` scores) in chat questions;
* short questions about the manual's topic names;
* everyday chat questions (how things work, tips, why questions, how-tos,
  short explanations), built from templates and subjects;
* raw code-completion heads (a signature and a docstring).

None of them is a prompt that `minillm bench spec` or notebook 09 measures, nor
about the same subject (`BENCH_SUBJECTS`; tests/test_spec_medusa.py checks).
"""
from __future__ import annotations

import random

# disjoint from the prompts `minillm bench spec` and notebook 09 measure on (no function trained on is scored)
CODE_HEADS = (
    ("linear_search(items, target)", "Return the first index of target in items, or -1."),
    ("char_histogram(text)", "Return a dict mapping each character of text to its count."),
    ("is_perfect_square(n)", "Return True if n is the square of an integer."),
    ("flatten(nested)", "Flatten a list of lists into one list."),
    ("fibonacci(n)", "Return the n-th Fibonacci number."),
    ("merge_sorted(a, b)", "Merge two sorted lists into one sorted list."),
    ("reverse_words(sentence)", "Return the sentence with its words in reverse order."),
    ("mean_and_std(values)", "Return the mean and the standard deviation of values."),
    ("read_csv_rows(path)", "Read a CSV file and return its rows as lists of strings."),
    ("gcd(a, b)", "Return the greatest common divisor of a and b."),
    ("chunks(items, size)", "Split items into consecutive lists of at most size elements."),
    ("count_vowels(text)", "Return how many vowels text contains."),
    ("transpose(matrix)", "Return the transpose of a matrix given as a list of rows."),
    ("unique_in_order(items)", "Return the items without duplicates, keeping the first occurrence."),
    ("celsius_to_fahrenheit(c)", "Convert a temperature from Celsius to Fahrenheit."),
    ("is_palindrome(text)", "Return True if text reads the same backwards, ignoring case and spaces."),
)
QUESTIONS = (
    "Explain this part of the Python reference in plain words:\n\n{}",
    "Summarize the following passage from the Python manual in a few sentences:\n\n{}",
    "What does this section of the Python documentation say? Give an example.\n\n{}",
)
# short open questions about the manual's topics (their names), for answers in everyday prose
TOPIC_QUESTIONS = (
    "What is {} in Python, and when would I use it?",
    "Explain {} to a beginner in a few sentences.",
    "Why does Python have {}? Answer briefly.",
)

# everyday chat: each template with its own subjects, so every question reads naturally
GENERAL_QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Explain how {} works.", (
        "a refrigerator", "a vaccine", "photosynthesis", "a bicycle's gears", "a credit card", "a solar panel",
        "a compass", "a microwave oven", "GPS navigation", "an electric motor", "a thermostat", "a heat pump",
        "the human heart", "a camera lens", "a wind turbine", "a battery", "an elevator", "a search engine")),
    ("Give me three tips for {}.", (
        "learning a new language", "saving money each month", "running a first marathon", "keeping houseplants alive",
        "studying for an exam", "a job interview", "speaking in public", "traveling on a budget", "staying focused at work",
        "making friends in a new city", "growing tomatoes", "taking better photos with a phone", "writing a cover letter",
        "cooking for a large family", "keeping a kitchen clean", "starting to meditate")),
    ("Why do {}?", (
        "cats purr", "leaves change color in autumn", "people get hiccups", "onions make people cry",
        "birds migrate", "people yawn", "bees make honey", "ears pop on an airplane", "dogs wag their tails",
        "stars twinkle", "bread dough rise", "people need vitamins", "metals feel cold to the touch",
        "some people get seasick")),
    ("What is {} and why is it important?", (
        "the Amazon rainforest", "the printing press", "DNA", "the Industrial Revolution", "the ozone layer",
        "democracy", "the water cycle", "biodiversity", "the immune system", "the Silk Road", "the Moon's gravity",
        "compound interest", "the scientific method", "the Great Barrier Reef")),
    ("How do I {}?", (
        "boil an egg", "change a flat tire", "write a good resume", "start a vegetable garden", "make pancakes",
        "clean a cast iron pan", "train a puppy to sit", "tie a tie", "back up the photos on my phone",
        "fix a squeaky door", "brew a good cup of tea", "plan a birthday party", "budget for a holiday",
        "remove a coffee stain")),
    ("What are the benefits of {}?", (
        "drinking enough water", "regular exercise", "reading books", "learning to play an instrument",
        "walking every day", "eating vegetables", "keeping a journal", "volunteering", "cycling to work",
        "learning to swim")),
    ("Describe {} in a few sentences.", (
        "the city of Tokyo", "the Sahara desert", "a typical day of a farmer", "the Roman Empire", "a thunderstorm",
        "the planet Mars", "the life cycle of a butterfly", "a coral reef", "the Olympic Games", "a medieval castle")),
    ("What is the difference between {}?", (
        "weather and climate", "a virus and a bacterium", "a crocodile and an alligator", "baking soda and baking powder",
        "a lake and a sea", "a frog and a toad", "speed and velocity", "a comet and an asteroid",
        "an ocean and a sea", "a moth and a butterfly")),
    ("Write a short {}.", (
        "poem about the ocean", "story about a lost dog who finds its way home", "thank-you note to a teacher",
        "description of a sunset over the mountains", "poem about autumn", "story about a robot learning to paint",
        "letter inviting a friend to dinner", "product description for a water bottle")),
    ("Tell me some interesting facts about {}.", (
        "octopuses", "the human brain", "Mount Everest", "honeybees", "the Pacific Ocean", "elephants",
        "volcanoes", "ancient Egypt", "penguins", "the Moon")),
)
# more of the same kinds, appended after GENERAL_QUESTIONS' own so that the first 124 questions stay the ones the
# shipped heads were trained on (their metadata's --num-general-questions 124 reproduces them)
MORE_GENERAL_QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Explain how {} works.", (
        "a dishwasher", "a smoke detector", "a washing machine", "a hot air balloon", "a submarine", "a touchscreen",
        "a pressure cooker", "a toaster", "a barcode scanner", "an air conditioner", "a helicopter", "a lock and key",
        "the human kidney", "a sailboat")),
    ("Give me three tips for {}.", (
        "writing a clear email", "running a small business", "organizing a closet", "learning to draw",
        "reducing food waste", "hiking safely", "negotiating a salary", "keeping a long-distance friendship strong",
        "training for a 5K race", "packing a suitcase", "teaching a child to read", "staying motivated at the gym",
        "managing stress before a deadline")),
    ("Why do {}?", (
        "cats knead with their paws", "people blush", "ice cubes float in water", "apples turn brown after being cut",
        "owls hunt at night", "people get goosebumps", "snakes shed their skin", "tides rise and fall",
        "fireflies glow", "chameleons change color", "some people have freckles", "dogs pant", "muscles cramp",
        "roosters crow in the morning")),
    ("What is {} and why is it important?", (
        "the Renaissance", "the Magna Carta", "the carbon cycle", "an emergency fund", "the United Nations",
        "the Rosetta Stone", "the Gulf Stream", "the food chain", "the periodic table", "the Internet", "pollination",
        "the Mississippi River", "antibiotic resistance")),
    ("How do I {}?", (
        "unclog a kitchen sink", "make a simple tomato sauce", "hang a picture straight", "prepare for a long hike",
        "set up a home Wi-Fi network", "iron a dress shirt", "write a polite complaint letter", "repot a houseplant",
        "make homemade pizza dough", "choose a good watermelon", "patch a small hole in a wall",
        "teach my dog to come when called", "open a savings account")),
    ("What are the benefits of {}?", (
        "learning a second language", "gardening", "practicing yoga", "cooking at home", "having a pet",
        "stretching before exercise", "spending time in nature", "composting kitchen scraps", "playing chess",
        "taking the stairs", "eating breakfast", "doing puzzles")),
    ("Describe {} in a few sentences.", (
        "the Grand Canyon", "a busy street market", "the Amazon River", "a lighthouse on a rocky coast",
        "the city of Rome", "a snowy mountain village", "the Great Wall of China", "a hummingbird",
        "a tropical rainforest", "the inside of a bakery", "a total solar eclipse", "the Arctic tundra")),
    ("What is the difference between {}?", (
        "a hurricane and a tornado", "a fruit and a vegetable", "an ape and a monkey", "a stock and a bond",
        "weight and mass", "a debit card and a credit card", "a rabbit and a hare", "a cold and the flu",
        "a mountain and a hill", "a violin and a viola", "a cappuccino and a latte", "a dolphin and a porpoise")),
    ("Write a short {}.", (
        "poem about a rainy afternoon", "story about a dragon who is afraid of heights",
        "birthday message for a grandmother", "poem about the first snow of winter",
        "note apologizing for missing a meeting", "story about two friends on a road trip",
        "review of a cozy neighborhood café", "speech for a friend's wedding", "poem about a city at night",
        "welcome message for new club members", "story about a cat who becomes a detective",
        "farewell note to a coworker", "haiku about spring")),
    ("Tell me some interesting facts about {}.", (
        "sharks", "giraffes", "the planet Jupiter", "ancient Rome", "the human skeleton", "dolphins", "Antarctica",
        "ants", "the Great Pyramid of Giza", "owls", "coffee", "Iceland")),
    ("What should I know before {}?", (
        "adopting a dog", "buying a used car", "moving to a new country", "starting a new job",
        "renting my first apartment", "going on a camping trip", "running a half marathon", "getting a tattoo",
        "taking out a student loan", "learning to drive", "traveling to Japan", "hosting a dinner party",
        "planting a fruit tree", "starting a podcast", "quitting my job", "buying a laptop", "climbing a mountain",
        "going scuba diving", "painting a room", "joining a gym")),
    ("Can you suggest some ideas for {}?", (
        "a rainy weekend at home", "a child's birthday party", "a picnic lunch", "a school science fair project",
        "a small balcony garden", "a family game night", "a budget-friendly date", "a thank-you gift for a neighbor",
        "decorating a tiny kitchen", "a short story plot", "a team-building activity at work",
        "a healthy packed lunch", "a summer road trip", "a fundraising event", "a beginner woodworking project",
        "a homemade holiday card", "keeping kids busy during a long trip", "a themed costume party",
        "a weekend in the countryside", "a book club discussion")),
    ("How can I improve {}?", (
        "my handwriting", "my cooking skills", "my posture at the desk", "my running speed", "my memory",
        "my vocabulary", "my credit score", "my chess game", "the soil in my garden", "my time management",
        "my singing voice", "my drawing skills", "the air quality in my home", "my typing speed",
        "my listening skills", "the battery life of my phone", "my swimming technique", "my photography",
        "my essay writing", "my relationship with my coworkers")),
    ("What causes {}?", (
        "earthquakes", "thunder", "the seasons", "ocean waves", "tooth decay", "allergies", "inflation", "a headache",
        "the northern lights", "fog", "rust on iron", "volcanic eruptions", "hail", "a fever", "jet lag",
        "static electricity", "traffic jams", "muscle soreness after exercise", "droughts", "acid rain")),
    ("Compare {} in a short paragraph.", (
        "cats and dogs as pets", "trains and planes for long trips", "renting and buying a home", "tea and coffee",
        "e-books and paper books", "city life and country life", "running and swimming as exercise",
        "public and private schools", "electric cars and gasoline cars", "laptops and tablets",
        "the piano and the guitar for beginners", "working from home and working in an office",
        "summer and winter holidays", "soccer and basketball", "oil paint and watercolor", "saving and investing",
        "the Arctic and the Antarctic", "wolves and coyotes", "baking and frying", "podcasts and audiobooks")),
    ("Summarize the history of {} briefly.", (
        "the bicycle", "chocolate", "the telephone", "paper money", "aviation", "jazz music", "the Roman alphabet",
        "vaccines", "the Panama Canal", "tea", "the automobile", "photography", "basketball", "the Vikings",
        "ancient Greece", "the Byzantine Empire", "space exploration", "the piano", "pizza", "the Red Cross")),
    ("What are common mistakes when {}?", (
        "learning to cook", "buying a house", "writing a resume", "planting a garden", "starting a business",
        "learning to play guitar", "training a puppy", "lifting weights", "painting a wall", "applying for a loan",
        "planning a wedding", "taking notes in class", "traveling abroad", "investing in stocks", "baking bread",
        "learning a foreign language", "writing an essay", "caring for a cat", "giving a presentation",
        "washing clothes")),
    ("Explain {} to a ten-year-old.", (
        "gravity", "electricity", "how money works", "the solar system", "why we have laws",
        "what a computer program is", "evolution", "how plants grow", "the internet", "what atoms are",
        "how the heart pumps blood", "recycling", "how airplanes fly", "what germs are", "the food pyramid",
        "why the Moon has phases", "how volcanoes form", "what a government does", "magnets", "fractions")),
    ("Recommend a simple recipe for {}.", (
        "a vegetable soup", "banana bread", "a quick weeknight pasta", "homemade granola", "a lentil curry",
        "chocolate chip cookies", "a Greek salad", "fried rice", "guacamole", "a fruit smoothie",
        "roasted vegetables", "a chicken stir-fry", "oatmeal for breakfast", "hummus", "a tomato omelette",
        "apple crumble", "a bean chili", "lemonade", "potato salad", "a vegetarian sandwich")),
    ("What is a good way to {}?", (
        "learn to code", "meet new people", "organize my bookshelf", "remember people's names", "pay off debt",
        "get started with running", "keep a garden watered while on holiday",
        "practice a musical instrument every day", "decorate a small room", "teach kids about money",
        "store fresh herbs", "learn world geography", "celebrate a friend's promotion", "cut down on sugar",
        "spend a free afternoon", "thank a mentor", "reduce plastic at home", "prepare for a driving test",
        "study a new subject on my own", "make a long flight more comfortable")),
    ("List the pros and cons of {}.", (
        "owning a car", "working part-time while studying", "living in a big city", "social media", "homeschooling",
        "solar power", "nuclear energy", "online shopping", "a four-day work week", "freelancing",
        "renting an apartment", "electric scooters", "school uniforms", "video games for children", "living abroad",
        "having a roommate", "fast food", "wind farms", "self-checkout machines", "camping vacations")),
    ("What is the best way to care for {}?", (
        "a goldfish", "a leather jacket", "a wooden cutting board", "an orchid", "a hamster", "a bonsai tree",
        "a cast iron skillet", "running shoes", "a new tattoo", "a pet rabbit", "a vegetable garden in summer",
        "wool sweaters", "an acoustic guitar", "succulents", "a parrot", "hardwood floors", "a sourdough starter",
        "an aging dog", "a newborn kitten", "silver jewelry")),
)
# the subjects of the chat prompts measured by `minillm bench spec` and notebook 09: never trained on
BENCH_SUBJECTS = ("capital", "France", "rainbow", "sleep", "sky")


def general_questions() -> list[str]:
    """Every everyday chat question, templates interleaved so that any prefix mixes them."""
    out = []
    for table in (GENERAL_QUESTIONS, MORE_GENERAL_QUESTIONS):  # the first table's questions first, as before
        per = [[tpl.format(s) for s in subjects] for tpl, subjects in table]
        for i in range(max(len(p) for p in per)):
            out += [p[i] for p in per if i < len(p)]
    return out


def training_prompts(tokenizer, num_chat_prompts: int, num_topic_questions: int, num_general_questions: int,
                     passage_chars: int, seed: int) -> list[list[int]]:
    """Token ids of every prompt: pydoc passages (calib split), topic questions, everyday chat, code heads."""
    from pydoc_data.topics import topics

    def chat(q: str) -> str:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True)
        return q

    names = sorted(topics)
    names = names[len(names) // 2:]  # the calib half: never the text perplexity is scored on
    rng = random.Random(seed)
    texts = []
    for i in range(num_chat_prompts):
        text = topics[names[i % len(names)]].strip()
        start = rng.randrange(max(1, len(text) - passage_chars))
        texts.append(chat(QUESTIONS[i % len(QUESTIONS)].format(text[start : start + passage_chars])))
    for i in range(num_topic_questions):
        topic = names[rng.randrange(len(names))].replace("-", " ")
        texts.append(chat(TOPIC_QUESTIONS[i % len(TOPIC_QUESTIONS)].format(topic)))
    general = general_questions()
    if num_general_questions > len(general):
        raise ValueError(f"{num_general_questions} everyday questions asked for; there are {len(general)}")
    texts += [chat(q) for q in general[:num_general_questions]]
    texts += [f'def {sig}:\n    """{doc}"""\n' for sig, doc in CODE_HEADS]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]
