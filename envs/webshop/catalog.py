"""A deterministic, seeded product catalog in WebShop's real file format.

`generate_catalog(num_products, seed, goals_per_product)` returns a `RawData` (product records as in
`items_shuffle*.json`, attributes and one synthetic instruction per product as in `items_ins_v2*.json`,
human-style instructions as in `items_human_ins.json`), so everything downstream (normalisation, goals,
search, pages, reward) runs exactly as on the real files.

Products come from product *types* (`TYPES`): each has a search query, a category path, name nouns, an
attribute pool and option groups. A catalog spreads `num_products` over all types, so every goal has
many distractors:

* same-type products (same query, same category): other attribute subsets, other option values, other
  prices; buying one usually loses attributes, options or the price term;
* sibling types that share name nouns and category levels (men's and women's running shoes, shoe
  racks; shampoo and hair oil; wireless earbuds and wireless headphones), which the search engine
  returns for the same keywords.

Vocabularies are chosen so that no two attributes of a pool and no two values of an option group match
each other under the reward's fuzzy rule (`tests/envs/test_webshop.py` checks it), so choosing the item
and the options both change the reward.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .data import RawData

CATEGORY_ROOTS = {
    "beauty": "Beauty & Personal Care",
    "food": "Grocery & Gourmet Food",
    "fashion": "Clothing, Shoes & Jewelry",
    "furniture": "Home & Kitchen",
    "electronics": "Electronics",
}


@dataclass(frozen=True)
class ProductType:
    category: str                 # one of CATEGORY_ROOTS
    query: str                    # the product's `query` field, and the noun phrase of its instructions
    path: str                     # category levels below the root, "A › B › C"
    nouns: tuple[str, ...]        # name heads, title case
    attributes: tuple[str, ...]   # attribute pool (lower case, as in items_ins_v2)
    options: tuple[tuple[str, tuple[str, ...]], ...]   # (option name, values) as shown on the site
    price: tuple[float, float]    # price range of the type


def _t(category, query, path, nouns, attributes, options, price):
    return ProductType(category, query, path, tuple(nouns.split("|")), tuple(attributes.split("|")),
                       tuple((name, tuple(values.split("|"))) for name, values in options), price)


# Values use "|" as separator here; option values keep WebShop's spelling conventions.
TYPES: tuple[ProductType, ...] = (
    # ---- beauty
    _t("beauty", "deodorant", "Personal Care › Deodorants & Antiperspirants › Deodorants",
       "Deodorant Stick|Natural Deodorant|Deodorant",
       "aluminum free|long lasting|sensitive skin|cruelty free|paraben free|travel size|baking soda free",
       [("scent", "Lavender|Unscented|Coconut|Citrus|Sandalwood|Eucalyptus Mint"),
        ("size", "Regular|Twin Pack|Family Pack")], (6, 32)),
    _t("beauty", "shampoo", "Hair Care › Shampoo & Conditioner › Shampoos",
       "Shampoo|Daily Shampoo|Clarifying Shampoo",
       "sulfate free|dry hair|hair growth|color treated|tea tree|argan oil|dandruff control",
       [("size", "12 Fl Oz|33 Fl Oz|1 Gallon"), ("scent", "Rosemary|Unscented|Peppermint|Citrus")], (7, 45)),
    _t("beauty", "hair oil", "Hair Care › Styling Products › Hair Oils",
       "Hair Oil|Hair Serum Oil|Scalp Oil",
       "argan oil|dry hair|hair growth|natural ingredients|damaged hair|heat protection|non greasy",
       [("size", "30 ml|100 ml|250 ml")], (8, 50)),
    _t("beauty", "lipstick", "Makeup › Lips › Lipstick",
       "Matte Lipstick|Lipstick|Liquid Lipstick",
       "long lasting|cruelty free|highly pigmented|paraben free|easy apply|vegan formula|waterproof finish",
       [("color", "Classic Red|Nude|Berry|Coral|Mauve|Plum")], (5, 30)),
    _t("beauty", "face moisturizer", "Skin Care › Face › Creams & Moisturizers",
       "Face Moisturizer|Daily Face Cream|Night Cream",
       "dry skin|fine lines|hyaluronic acid|fragrance free|sensitive skin|dermatologist tested|oil free",
       [("size", "1.7 Ounce|3.4 Ounce|6 Ounce")], (9, 70)),
    _t("beauty", "toothpaste", "Oral Care › Toothpaste",
       "Toothpaste|Whitening Toothpaste|Fluoride Toothpaste",
       "teeth whitening|fluoride free|sensitive teeth|fresh breath|clinically proven|natural ingredients",
       [("flavor name", "Mint|Cinnamon|Charcoal|Strawberry"), ("size", "Single Tube|Twin Pack|Family Pack")],
       (3, 25)),
    _t("beauty", "makeup brushes", "Tools & Accessories › Makeup Brushes & Tools › Brush Sets",
       "Makeup Brush Set|Makeup Brushes|Foundation Brush Set",
       "high quality|easy clean|cruelty free|synthetic bristles|travel case|eye shadow",
       [("color", "Rose Gold|Black|Pink|White|Purple")], (6, 40)),
    _t("beauty", "body wash", "Personal Care › Bath & Bathing Accessories › Bath › Body Washes",
       "Body Wash|Shower Gel|Moisturizing Body Wash",
       "dry skin|paraben free|shea butter|aloe vera|sulfate free|natural ingredients",
       [("scent", "Lavender|Coconut|Oatmeal|Eucalyptus|Unscented"), ("size", "16 Fl Oz|24 Fl Oz (Pack of 2)")], (5, 35)),
    # ---- food
    _t("food", "trail mix", "Snacks & Sweets › Snack Foods › Trail Mix",
       "Trail Mix|Trail Mix Snack Packs|Nut & Fruit Trail Mix",
       "gluten free|non gmo|keto friendly|low sugar|high protein|individually wrapped|plant based",
       [("flavor name", "Sour Cream & Onion|Sea Salt|Dark Chocolate|Honey Roasted|Mixed Berry"),
        ("size", "6 Count|18 Count|30 Count")], (8, 48)),
    _t("food", "protein bars", "Snacks & Sweets › Snack Foods › Bars › Protein Bars",
       "Protein Bars|Protein Snack Bars|Whey Protein Bars",
       "gluten free|low sugar|high protein|keto friendly|non gmo|soy free|low carb",
       [("flavor name", "Peanut Butter|Chocolate Chip|Cookies & Cream|Birthday Cake|Salted Caramel"),
        ("size", "4 Count|12 Count|30 Count")], (9, 55)),
    _t("food", "granola", "Breakfast Foods › Cereals › Granola",
       "Granola|Granola Clusters|Crunchy Granola",
       "gluten free|non gmo|low sugar|plant based|whole grain|usda organic",
       [("flavor name", "Honey Almond|Maple Pecan|Blueberry|Coconut Cashew"), ("size", "11 Ounce|2 Pound|50 Ounce")],
       (5, 36)),
    _t("food", "ground coffee", "Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
       "Ground Coffee|Coffee|Whole Bean Coffee",
       "fair trade|usda organic|medium roast|dark roast|non gmo|single origin",
       [("flavor name", "French Roast|Breakfast Blend|Hazelnut|Colombian|Espresso"),
        ("size", "10 Ounce|24 Ounce|2 Pound")], (7, 60)),
    _t("food", "green tea", "Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
       "Green Tea|Green Tea Bags|Matcha Green Tea",
       "usda organic|caffeine free|non gmo|fair trade|gluten free|individually wrapped",
       [("flavor name", "Jasmine|Lemon Ginger|Original|Peach"), ("size", "20 Count|48 Count|100 Count")], (4, 30)),
    _t("food", "olive oil", "Pantry Staples › Cooking & Baking › Oils › Olive Oil",
       "Extra Virgin Olive Oil|Olive Oil|Cold Pressed Olive Oil",
       "cold pressed|usda organic|non gmo|single origin|first harvest|glass bottle",
       [("size", "16.9 Fl Oz|33.8 Fl Oz|101 Fl Oz")], (9, 65)),
    _t("food", "hot sauce", "Pantry Staples › Condiments & Salad Dressings › Hot Sauce",
       "Hot Sauce|Pepper Sauce|Chili Sauce",
       "gluten free|low sodium|sugar free|non gmo|small batch|vegan friendly",
       [("flavor name", "Habanero|Chipotle|Jalapeno|Ghost Pepper|Garlic"), ("size", "5 Ounce|10 Ounce (Pack of 2)")],
       (4, 28)),
    _t("food", "gummy candy", "Snacks & Sweets › Candy & Chocolate › Gummy Candies",
       "Gummy Candy|Gummy Bears|Sour Gummies",
       "gluten free|fat free|individually wrapped|halal certified|vegan friendly|real fruit juice",
       [("flavor name", "Assorted Fruit|Sour Apple|Watermelon|Cherry"), ("size", "2 Pound|10 Pound")], (5, 38)),
    # ---- fashion
    _t("fashion", "men's running shoes", "Men › Shoes › Athletic › Running",
       "Running Shoes|Road Running Shoes|Trail Running Shoes",
       "rubber sole|non slip|lightweight design|breathable mesh|arch support|memory foam",
       [("color", "Black|White|Navy|Grey|Olive"), ("size", "7|8|9|10|11|12|13")], (30, 140)),
    _t("fashion", "women's running shoes", "Women › Shoes › Athletic › Running",
       "Running Shoes|Walking Running Shoes|Athletic Running Shoes",
       "rubber sole|non slip|lightweight design|breathable mesh|arch support|memory foam",
       [("color", "Black|White|Pink|Grey|Purple"), ("size", "5|6|7|8|9|10")], (28, 130)),
    _t("fashion", "women's sandals", "Women › Shoes › Sandals",
       "Flat Sandals|Slide Sandals|Wedge Sandals",
       "open toe|ankle strap|rubber sole|arch support|memory foam|non slip",
       [("color", "Black|Beige|Brown|White|Gold"), ("size", "5|6|7|8|9|10")], (15, 70)),
    _t("fashion", "men's t-shirts", "Men › Clothing › Shirts › T-Shirts",
       "T-Shirt|Crew Neck T-Shirt|Graphic T-Shirt",
       "machine wash|classic fit|short sleeve|moisture wicking|cotton blend|tagless collar",
       [("color", "Black|White|Heather Grey|Navy|Red"), ("size", "Small|Medium|Large|3X|Petite")], (8, 35)),
    _t("fashion", "women's leggings", "Women › Clothing › Active › Leggings",
       "Leggings|Yoga Leggings|High Waist Leggings",
       "high waist|tummy control|moisture wicking|squat proof|machine wash|side pockets",
       [("color", "Black|Navy|Olive|Burgundy|Grey"), ("size", "Small|Medium|Large|3X|Petite")], (12, 45)),
    _t("fashion", "men's jeans", "Men › Clothing › Jeans",
       "Jeans|Slim Fit Jeans|Relaxed Fit Jeans",
       "machine wash|stretch denim|button closure|relaxed fit|slim fit|zipper fly",
       [("color", "Indigo|Light Blue|Black|Charcoal"), ("size", "29W x 30L|32W x 32L|36W x 34L")],
       (20, 80)),
    _t("fashion", "women's dresses", "Women › Clothing › Dresses",
       "Maxi Dress|Midi Dress|Wrap Dress",
       "short sleeve|machine wash|v neck|side pockets|elastic waist|hand wash",
       [("color", "Black|Floral Blue|Red|Green|Yellow"), ("size", "Small|Medium|Large|3X|Petite")], (18, 75)),
    _t("fashion", "baseball caps", "Men › Accessories › Hats & Caps › Baseball Caps",
       "Baseball Cap|Dad Hat|Trucker Hat",
       "adjustable strap|cotton twill|sun protection|machine wash|mesh back|curved brim",
       [("color", "Black|Khaki|Navy|Red|White")], (8, 30)),
    # ---- furniture
    _t("furniture", "office chair", "Furniture › Home Office Furniture › Home Office Chairs › Desk Chairs",
       "Office Chair|Ergonomic Desk Chair|Executive Office Chair",
       "lumbar support|height adjustable|easy assemble|high back|breathable mesh|heavy duty",
       [("color", "Black|Grey|White|Blue")], (60, 300)),
    _t("furniture", "bookcase", "Furniture › Living Room Furniture › Bookcases",
       "Bookcase|Bookshelf|Ladder Bookshelf",
       "easy assemble|solid wood|storage space|heavy duty|wall mounted|engineered wood",
       [("color", "Walnut|Black|White|Oak"), ("size", "3-Tier|5-Tier")], (40, 220)),
    _t("furniture", "coffee table", "Furniture › Living Room Furniture › Tables › Coffee Tables",
       "Coffee Table|Lift Top Coffee Table|Round Coffee Table",
       "storage space|easy assemble|solid wood|tempered glass|metal frame|mid century",
       [("color", "Walnut|Black|White|Rustic Brown")], (50, 260)),
    _t("furniture", "tv stand", "Furniture › Living Room Furniture › TV & Media Furniture › Television Stands",
       "TV Stand|Entertainment Center|Media Console",
       "storage space|easy assemble|cable management|engineered wood|metal frame|led lights",
       [("color", "Black|Walnut|White|Grey"), ("size", "32 Inch|55 Inch|70 Inch")], (60, 280)),
    _t("furniture", "bed frame", "Furniture › Bedroom Furniture › Beds, Frames & Bases › Bed Frames",
       "Platform Bed Frame|Bed Frame|Upholstered Bed Frame",
       "easy assemble|noise free|under bed storage|metal frame|solid wood|no box spring needed",
       [("size", "Twin|Full|Queen|King"), ("color", "Black|Grey|White")], (90, 400)),
    _t("furniture", "nightstand", "Furniture › Bedroom Furniture › Nightstands",
       "Nightstand|Bedside Table|Night Stand with Drawer",
       "storage space|easy assemble|solid wood|charging station|metal frame|engineered wood",
       [("color", "Black|White|Walnut|Grey"), ("size", "1 Piece|2 Pieces")], (30, 150)),
    _t("furniture", "shoe rack", "Storage & Organization › Clothing & Closet Storage › Shoe Organizers › Free Standing Shoe Racks",
       "Shoe Rack|Shoe Storage Rack|Shoe Organizer Rack",
       "easy assemble|metal frame|heavy duty|space saving|stackable design|entryway storage",
       [("color", "Black|White|Bronze|Natural"), ("size", "3-Tier|5-Tier|8-Tier")], (20, 90)),
    _t("furniture", "bar stools", "Furniture › Kitchen & Dining Room Furniture › Stools › Barstools",
       "Bar Stools|Counter Height Stools|Swivel Bar Stools",
       "easy assemble|height adjustable|faux leather|metal frame|footrest|swivel seat",
       [("color", "Black|Grey|White|Brown"), ("size", "Pair|Set of 4")], (50, 240)),
    # ---- electronics
    _t("electronics", "wireless earbuds", "Headphones, Earbuds & Accessories › Headphones & Earbuds › Earbud Headphones",
       "Wireless Earbuds|Bluetooth Earbuds|True Wireless Earbuds",
       "noise cancelling|water resistant|long battery life|fast charging|hands free|touch control",
       [("color", "Black|White|Navy|Pink")], (15, 120)),
    _t("electronics", "wireless headphones", "Headphones, Earbuds & Accessories › Headphones & Earbuds › Over-Ear Headphones",
       "Wireless Headphones|Over Ear Headphones|Bluetooth Headphones",
       "noise cancelling|long battery life|fast charging|hands free|foldable design|memory foam",
       [("color", "Black|Silver|White|Blue")], (25, 250)),
    _t("electronics", "portable charger", "Computers & Accessories › Power Banks › Portable Chargers",
       "Portable Charger|Power Bank|Battery Pack",
       "fast charging|usb c|high capacity|led display|compact size|wireless charging",
       [("color", "Black|White|Blue|Red"), ("size", "5000mAh|10000mAh|26800mAh")], (15, 80)),
    _t("electronics", "bluetooth speaker", "Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
       "Bluetooth Speaker|Portable Speaker|Waterproof Speaker",
       "water resistant|long battery life|hands free|stereo sound|deep bass|outdoor use",
       [("color", "Black|Blue|Red|Green|Grey")], (20, 150)),
    _t("electronics", "usb c cable", "Computers & Accessories › Cables & Accessories › Cables & Interconnects › USB Cables",
       "USB C Cable|Charging Cable|Fast Charging Cable",
       "fast charging|braided nylon|data transfer|high speed|durable design|usb c",
       [("size", "3 Ft|6 Ft|10 Ft"), ("color", "Black|White|Grey")], (5, 25)),
    _t("electronics", "hdmi cable", "Computers & Accessories › Cables & Accessories › Cables & Interconnects › HDMI Cables",
       "HDMI Cable|High Speed HDMI Cable|4K HDMI Cable",
       "high speed|braided nylon|gold plated|ultra hd|ethernet support|durable design",
       [("size", "3 Ft|6 Ft|15 Ft")], (6, 30)),
    _t("electronics", "smart watch band", "Wearable Technology › Clips, Arm & Wristbands",
       "Watch Band|Smart Watch Band|Sport Watch Band",
       "quick release|stainless steel|soft silicone|adjustable strap|water resistant|breathable design",
       [("color", "Black|Silver|Pink|Navy|Olive"), ("size", "38mm|42mm|45mm")], (6, 35)),
)

BRAND_PARTS = ("Alder Birch Cedar Dune Elm Fern Glen Harbor Iris Juniper Kestrel Linden Maple North Oak Pine Quill "
               "Ridge Summit Thistle Umber Vale Willow Yarrow Zephyr").split()
BRAND_TAILS = "brook field wood stone crest line ware craft works co lab home".split()
GENERIC_BULLETS = (
    "Designed for everyday use at home, at work and on the go",
    "Backed by a 30-day satisfaction guarantee from our support team",
    "Packed with care in recyclable packaging",
    "Thousands of customers choose it again and again",
)
INSTRUCTION_TEMPLATES = (
    "i need {attrs} {noun}{options}",
    "i am looking for {attrs} {noun}{options}",
    "i'm looking for {noun} that is {attrs}{options}",
    "find me {attrs} {noun}{options}",
    "i want to buy {noun} which is {attrs}{options}",
    "looking for {attrs} {noun}{options}",
)


def _join_and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _option_clause(chosen: list[tuple[str, str]], rng: random.Random) -> str:
    if not chosen:
        return ""
    if rng.random() < 0.5:
        return " with " + " and ".join(f"{name}: {value}" for name, value in chosen)
    return ", " + " and ".join(f"{value} {name}" if name in ("color", "scent", "flavor name") else f"{name} {value}"
                               for name, value in chosen)


def _asin(rng: random.Random, used: set[str]) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _price(lo: float, hi: float, rng: random.Random) -> float:
    return round(rng.uniform(lo, hi), 0) - 0.01


def _product(t: ProductType, asin: str, rng: random.Random) -> tuple[dict, list[str]]:
    attrs = rng.sample(t.attributes, rng.randint(3, min(5, len(t.attributes))))
    brand = rng.choice(BRAND_PARTS) + rng.choice(BRAND_TAILS)
    noun = rng.choice(t.nouns)
    title_attrs = [a.title() for a in attrs[: rng.randint(1, 2)]]
    extra = rng.choice(("", "", f", {attrs[-1].title()}", " for Everyday Use", " - Value Pack"))
    name = f"{brand} {' '.join(title_attrs)} {noun}{extra}".replace("  ", " ")
    options = {}
    for opt_name, values in t.options:
        k = rng.randint(min(2, len(values)), len(values))
        picked = sorted(rng.sample(range(len(values)), k))
        options[opt_name.title()] = [{"value": values[i], "image": None} for i in picked]
    lo, hi = t.price
    if rng.random() < 0.3:
        a, b = sorted((_price(lo, hi, rng), _price(lo, hi, rng)))
        b = max(b, a + 2)
        pricing = f"${a:.2f} - ${b:.2f}"
    else:
        pricing = f"${_price(lo, hi, rng):.2f}"
    bullets = [f"{a.capitalize()}: one of the reasons to choose this {noun.lower()}" for a in attrs]
    bullets.append(rng.choice(GENERIC_BULLETS))
    description = (f"The {brand} {noun.lower()} is {_join_and(attrs[:2])}. "
                   f"{rng.choice(GENERIC_BULLETS)}.")
    record = {
        "asin": asin,
        "name": name,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "list_price": "",
        "customization_options": options or None,
        "images": [],
        "category": t.category,
        "query": t.query,
        "product_category": f"{CATEGORY_ROOTS[t.category]} › {t.path}",
        "brand": brand,
        "brand_url": "",
        "average_rating": round(rng.uniform(3.0, 5.0), 1),
        "total_reviews": rng.randint(0, 2000),
        "total_answered_questions": rng.randint(0, 40),
        "availability_status": "In Stock.",
        "availability_quantity": None,
        "product_information": {},
        "seller_id": "", "seller_name": "", "fulfilled_by_amazon": bool(rng.random() < 0.5),
        "fast_track_message": "", "aplus_present": False, "small_description_old": "",
    }
    return record, attrs


def _human_instructions(t: ProductType, asin: str, attrs: list[str], options: dict, n: int,
                        rng: random.Random) -> list[dict]:
    out: list[dict] = []
    for _ in range(n):
        ins_attrs = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
        chosen = [(name.lower(), rng.choice(vals)["value"].lower()) for name, vals in options.items()]
        text = rng.choice(INSTRUCTION_TEMPLATES).format(attrs=_join_and(ins_attrs), noun=t.query,
                                                        options=_option_clause(chosen, rng))
        values = [v for _, v in chosen]
        out.append({"asin": asin, "instruction": text, "attributes": ins_attrs, "options": values,
                    "instruction_attributes": ins_attrs, "instruction_options": values,
                    "assignment_id": f"gen-{asin}-{len(out)}", "worker_id": "generated"})
    return out


def generate_catalog(num_products: int = 1000, seed: int = 0, goals_per_product: int = 3) -> RawData:
    """A catalog of `num_products` products spread evenly over `TYPES`, deterministic in `seed`."""
    if num_products < len(TYPES):
        raise ValueError(f"num_products must be at least {len(TYPES)} (one per product type), got {num_products}")
    rng = random.Random(seed)
    used: set[str] = set()
    products, attributes, human = [], {}, {}
    for i in range(num_products):
        t = TYPES[i % len(TYPES)]
        asin = _asin(rng, used)
        record, attrs = _product(t, asin, rng)
        products.append(record)
        ins_attrs = rng.sample(attrs, min(len(attrs), rng.randint(2, 3)))
        attributes[asin] = {"attributes": attrs,
                            "instruction": f"Find me {', '.join(ins_attrs)} {t.query}",
                            "instruction_attributes": ins_attrs}
        human[asin] = _human_instructions(t, asin, attrs, record["customization_options"] or {},
                                          goals_per_product, rng)
    rng.shuffle(products)   # items_shuffle: the file's order carries no type order
    return RawData(products=products, attributes=attributes, human_instructions=human)
