"""PriFedSync's accounting on the new core reproduces the first release's numbers.

The first release (``fl/prifedsync.py`` before the port, main 57bba37) accounted each client
with its own ``ClientMechanism`` / ``ClientLedger`` and searched σ and K itself
(``calibrate_noise`` / ``calibrate_steps``). Those are gone: a client's records are rows of one
:class:`~pdpfl.ledger.PrivacyLedger` over a :class:`~pdpfl.privacy.unit.LocalStepsPlan`, and the
calibration is :func:`pdpfl.calibration.noise_for_epsilon` / ``steps_for_epsilon``. The tables
below were computed on 57bba37 with the first release's own code (``EPSILON``: ε, CLT ε, CLT μ
and the strong notion's ε for m = 5 clients; ``CALIBRATION``: σ_j and K_j), and

* the WOR ledger's ε is bit for bit the old one (Theorem 9 on the integer orders), for every
  observer; the CLT ε and μ (``gdp-clt``) are bit for bit the old ones for both samplers;
* the Poisson ledger's ε is never larger than the old grid minimum (the accountant refines the
  best order), and equal to it (to float rounding) on the grid alone (``refine=False``);
* the calibrated σ_j and K_j are the old ones exactly;
* record ids from the data key the ledger and survive a resumed (and extended) run.
"""

from __future__ import annotations

import numpy as np
import pytest

from pdpfl.fl.prifedsync import PriFedSyncSetup, client_plan
from pdpfl.fl.prifedsync.mechanism import clt_mu, epsilon, strong_epsilon
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy import LocalStepsPlan, mechanism_epsilon
from pdpfl.privacy.wor import WOR_ORDERS

DELTA = 1e-5

#: (sampler, B, n, σ, K, participations, ε rigorous, ε CLT, μ CLT, ε strong (m = 5)),
#: computed on 57bba37 with ClientMechanism.epsilon / clt_mu / strong_epsilon.
EPSILON = [
    ('wor', 16, 600, 0.7, 1, 1,
     11.91696803248796, 11.464131369463447, 2.2335862623444496, 17.287978818400823),
    ('wor', 16, 600, 0.7, 1, 7,
     22.65898960431369, 41.91390145438773, 5.909513781973687, 60.25606510570373),
    ('wor', 16, 600, 0.7, 1, 93,
     176.62796546714912, 322.9376856920138, 21.539925858601464, 676.1319685570455),
    ('wor', 16, 600, 0.7, 38, 1,
     78.15943439207996, 152.64116761554908, 13.768750432435262, 282.2578442567688),
    ('wor', 16, 600, 0.7, 38, 7,
     486.35625412145765, 817.9436149145388, 36.428689508336745, 1915.0451231742795),
    ('wor', 16, 600, 0.7, 38, 93,
     6337.177336909203, 9380.712007636297, 132.7810205856764, 25318.329454325267),
    ('wor', 16, 600, 1.1, 1, 1,
     5.101462093940503, 0.6910398783253577, 0.19128691074164111, 6.070037832194644),
    ('wor', 16, 600, 1.1, 1, 7,
     7.021297596308456, 2.020258707485142, 0.5060975948841924, 11.192051289251445),
    ('wor', 16, 600, 1.1, 1, 93,
     13.665348148218303, 9.053807468600404, 1.8447041623416192, 24.281499281322198),
    ('wor', 16, 600, 1.1, 38, 1,
     11.57255849832327, 5.303459767309102, 1.1791717111604492, 15.910340681742065),
    ('wor', 16, 600, 1.1, 38, 7,
     20.24812286516086, 17.544780602889634, 3.119795100773035, 50.61259814909243),
    ('wor', 16, 600, 1.1, 38, 93,
     144.597878789833, 112.30591922898077, 11.37152016967383, 548.011621847781),
    ('wor', 16, 600, 2.5, 1, 1,
     0.8054736430693261, 0.09764686248467132, 0.03182146250116154, 0.9085102372123076),
    ('wor', 16, 600, 2.5, 1, 7,
     0.9777482855618926, 0.28244631862084923, 0.08419167613244086, 1.3998751325877423),
    ('wor', 16, 600, 2.5, 1, 93,
     2.365413123585731, 1.160358762152332, 0.30687507106523526, 4.851539997469936),
    ('wor', 16, 600, 2.5, 38, 1,
     1.571969595374803, 0.7103079607575286, 0.19616066903711235, 3.028082213203459),
    ('wor', 16, 600, 2.5, 38, 7,
     4.064777107834757, 2.0778768843360336, 0.5189923472842473, 8.850849355221388),
    ('wor', 16, 600, 2.5, 38, 93,
     18.721325491657634, 9.33665443533609, 1.8917049852366359, 46.12740921504406),
    ('wor', 64, 1000, 0.7, 1, 1,
     13.269856660912144, 36.49701230873766, 5.36060702962668, 23.698064866912688),
    ('wor', 64, 1000, 0.7, 1, 7,
     33.87664018920945, 160.19112690669175, 14.182833076736847, 105.12666744528681),
    ('wor', 64, 1000, 0.7, 1, 93,
     325.66246609505004, 1555.745258789853, 51.6958220606435, 1272.269971068649),
    ('wor', 64, 1000, 0.7, 38, 1,
     139.0552518529427, 685.9790549659467, 33.04500103784463, 525.8411141002198),
    ('wor', 64, 1000, 0.7, 38, 7,
     912.6269763474968, 4193.800509434455, 87.42885482000817, 3620.128012078436),
    ('wor', 64, 1000, 0.7, 38, 93,
     12000.48836076944, 52134.82071318693, 318.67444940562336, 47971.5735497662),
    ('wor', 64, 1000, 1.1, 1, 1,
     6.056587594823969, 1.8121412439144744, 0.4590885857799387, 9.82127593916719),
    ('wor', 64, 1000, 1.1, 1, 7,
     11.538041726465533, 5.491081530687673, 1.2146342277220614, 15.772273594311116),
    ('wor', 64, 1000, 1.1, 1, 93,
     28.878229375737927, 27.984594837391406, 4.427289989619885, 85.1330241914007),
    ('wor', 64, 1000, 1.1, 38, 1,
     17.788574483761394, 15.467281445453558, 2.8300121067850776, 40.77440462349457),
    ('wor', 64, 1000, 1.1, 38, 7,
     63.760234763227736, 59.175047829891824, 7.487508241855283, 224.66104574135994),
    ('wor', 64, 1000, 1.1, 38, 93,
     722.6873654355787, 487.88408396542445, 27.291648407217195, 2860.3695684307636),
    ('wor', 64, 1000, 2.5, 1, 1,
     1.1939811372501477, 0.25398893687987645, 0.07637151000278769, 1.590563664654774),
    ('wor', 64, 1000, 2.5, 1, 7,
     1.8729045372617046, 0.7336974957377783, 0.202060022717858, 3.3380034980175957),
    ('wor', 64, 1000, 2.5, 1, 93,
     6.154814093862749, 3.0824836287560293, 0.7365001705565645, 13.458129886383816),
    ('wor', 64, 1000, 2.5, 38, 1,
     3.900893446468708, 1.863639111920209, 0.47078560568906963, 8.100515120065264),
    ('wor', 64, 1000, 2.5, 38, 7,
     10.991510340490972, 5.655960271482086, 1.2455816334821932, 25.640942393408004),
    ('wor', 64, 1000, 2.5, 38, 93,
     61.65630788702401, 28.96663056100548, 4.540091964567926, 216.24533823654505),
    ('wor', 10, 50, 0.7, 1, 1,
     14.97900677046828, 210.86780417997232, 16.751896967583374, 32.69099896519823),
    ('wor', 10, 50, 0.7, 1, 7,
     49.61427486120915, 1170.2622806037175, 44.321353364802654, 168.07720613328559),
    ('wor', 10, 50, 0.7, 1, 93,
     534.7481838801889, 13737.115138870375, 161.54944393951098, 2108.6128422092042),
    ('wor', 10, 50, 0.7, 38, 1,
     224.48812578665533, 5771.331742134005, 103.26562824326447, 867.5726098350704),
    ('wor', 10, 50, 0.7, 38, 7,
     1510.6570938834852, 38487.505515563156, 273.21517131252557, 6012.24848222239),
    ('wor', 10, 50, 0.7, 38, 93,
     19945.745636604715, 500112.46018396923, 995.8576543925731, 79752.6026531073),
    ('wor', 10, 50, 1.1, 1, 1,
     7.704279147815606, 6.686230577660633, 1.4346518305623084, 14.756162278033603),
    ('wor', 10, 50, 1.1, 1, 7,
     18.228310658671056, 22.72466199421255, 3.795731961631443, 42.53334932313321),
    ('wor', 10, 50, 1.1, 1, 93,
     117.76323090361126, 153.84264960734103, 13.835281217562143, 440.67303030289406),
    ('wor', 10, 50, 1.1, 38, 1,
     54.10717725859136, 76.00943928750021, 8.843787833703368, 186.04881572281445),
    ('wor', 10, 50, 1.1, 38, 7,
     317.9904541870375, 372.6177048824686, 23.398463255797765, 1241.581923436599),
    ('wor', 10, 50, 1.1, 38, 93,
     4100.3174234947655, 3999.6465487848236, 85.28640127255373, 16370.889800667514),
    ('wor', 10, 50, 2.5, 1, 1,
     2.098720711753955, 0.8803770814743864, 0.23866096875871154, 3.7342501390158547),
    ('wor', 10, 50, 2.5, 1, 7,
     4.944243660614003, 2.589675110890086, 0.6314375709933063, 10.841609473271063),
    ('wor', 10, 50, 2.5, 1, 93,
     22.592219702509666, 11.901737935729118, 2.3015630329892645, 59.98898549848766),
    ('wor', 10, 50, 2.5, 38, 1,
     12.998723042281124, 6.889927616189211, 1.4712050177783427, 30.500496340368816),
    ('wor', 10, 50, 2.5, 38, 7,
     45.780895267757664, 23.503857755416732, 3.8924426046318543, 152.74368775947966),
    ('wor', 10, 50, 2.5, 38, 93,
     483.8189978529049, 160.28249774454497, 14.187787389274769, 1904.8960981000685),
    ('poisson', 16, 600, 0.7, 1, 1,
     2.781831876149209, 0.2274275512437365, 0.06900893242212497, 3.2113266986868583),
    ('poisson', 16, 600, 0.7, 1, 7,
     3.445812031857347, 0.6567464029428155, 0.1825804734310049, 4.250745506705008),
    ('poisson', 16, 600, 0.7, 1, 93,
     5.584352343692062, 2.747925756270435, 0.6654980436679369, 8.824698658143499),
    ('poisson', 16, 600, 0.7, 38, 1,
     4.538132107045996, 1.6649046926962459, 0.425399629352887, 6.446556790706021),
    ('poisson', 16, 600, 0.7, 38, 7,
     7.765378396918933, 5.0221859818085495, 1.1255016270867917, 14.119680058646685),
    ('poisson', 16, 600, 0.7, 38, 93,
     26.815144142691004, 25.22823837705071, 4.10240545933509, 65.16284861204616),
    ('poisson', 16, 600, 1.1, 1, 1,
     1.0314816528426032, 0.09231148672367653, 0.030230914493984785, 1.1190892319970183),
    ('poisson', 16, 600, 1.1, 1, 7,
     1.1733964745213812, 0.2671026285051231, 0.07998348165714178, 1.3848054669938303),
    ('poisson', 16, 600, 1.1, 1, 93,
     1.80590840165496, 1.0966955786466668, 0.2915363815654293, 3.048284895365346),
    ('poisson', 16, 600, 1.1, 38, 1,
     1.4626420074668791, 0.6715970062517698, 0.1863558726292776, 2.1183658129719793),
    ('poisson', 16, 600, 1.1, 38, 7,
     2.6339054560336073, 1.962194119055235, 0.49305129433349704, 5.086345816603583),
    ('poisson', 16, 600, 1.1, 38, 93,
     9.792154992907545, 8.770021065037804, 1.797150952896839, 22.665220909384765),
    ('poisson', 16, 600, 2.5, 1, 1,
     0.15716071894186717, 0.03059404127086441, 0.011107902964144172, 0.17063442228728704),
    ('poisson', 16, 600, 2.5, 1, 7,
     0.1814366920525038, 0.08949617019335454, 0.02938874883056269, 0.25550119513629965),
    ('poisson', 16, 600, 2.5, 1, 93,
     0.4443193077266331, 0.36717440997170225, 0.10712073687320482, 0.8976204148202588),
    ('poisson', 16, 600, 2.5, 38, 1,
     0.2895537852122745, 0.22550593193007185, 0.06847371257579093, 0.5676196680830392),
    ('poisson', 16, 600, 2.5, 38, 7,
     0.7547985647547854, 0.651184368100667, 0.1811644148208588, 1.561334098468299),
    ('poisson', 16, 600, 2.5, 38, 93,
     2.9974124134229347, 2.723850387694572, 0.6603365703895391, 6.575222238926717),
    ('poisson', 64, 1000, 0.7, 1, 1,
     3.6252188732713937, 0.5904301709881479, 0.16562143781309993, 4.616109042277721),
    ('poisson', 64, 1000, 0.7, 1, 7,
     5.165546556612334, 1.7206271257758452, 0.43819313623441175, 7.3109015766061),
    ('poisson', 64, 1000, 0.7, 1, 93,
     10.865883661586683, 7.603119487255981, 1.5971953048030485, 20.19331823488839),
    ('poisson', 64, 1000, 0.7, 38, 1,
     7.946107134360721, 4.483646564848696, 1.0209591104469289, 13.310918969515475),
    ('poisson', 64, 1000, 0.7, 38, 7,
     17.31375104607633, 14.571568369461891, 2.7012039050083, 36.03589131875323),
    ('poisson', 64, 1000, 0.7, 38, 93,
     78.27386187614461, 89.63123456209442, 9.845773102404216, 219.8975439896451),
    ('poisson', 64, 1000, 1.1, 1, 1,
     1.4547065752724935, 0.24018836406071115, 0.07255419478556348, 1.7375461990182945),
    ('poisson', 64, 1000, 1.1, 1, 7,
     1.9108707174399784, 0.6936992947706029, 0.19196035597714028, 2.6648160013492346),
    ('poisson', 64, 1000, 1.1, 1, 93,
     4.09722933990354, 2.9082423953942054, 0.6996873157570304, 7.806385088601646),
    ('poisson', 64, 1000, 1.1, 38, 1,
     2.935604157479535, 1.760234438698217, 0.44725409431026625, 5.068187579989857),
    ('poisson', 64, 1000, 1.1, 38, 7,
     6.597629723406007, 5.325350971895965, 1.1833231064003928, 13.841793722014165),
    ('poisson', 64, 1000, 1.1, 38, 93,
     28.68120607919223, 27.004132145912195, 4.313162286952414, 74.30095170021127),
    ('poisson', 64, 1000, 2.5, 1, 1,
     0.24223120554465616, 0.08041932167269472, 0.026658967113946008, 0.3066648225690599),
    ('poisson', 64, 1000, 2.5, 1, 7,
     0.36353607062314325, 0.2329064829008277, 0.07053299719335046, 0.6430124176106198),
    ('poisson', 64, 1000, 2.5, 1, 93,
     1.1427894510297902, 0.9552014101914237, 0.25708976849569154, 2.335546866000773),
    ('poisson', 64, 1000, 2.5, 38, 1,
     0.740505455404203, 0.5854340331054151, 0.16433691018189822, 1.464522750964031),
    ('poisson', 64, 1000, 2.5, 38, 7,
     1.9561695026500932, 1.7058017081898624, 0.43479459557006106, 4.131392109825862),
    ('poisson', 64, 1000, 2.5, 38, 93,
     8.195120027969686, 7.532237888720768, 1.5848077689348936, 19.1758505111494),
    ('poisson', 10, 50, 0.7, 1, 1,
     5.037004802234884, 2.071496825030854, 0.5175669931659374, 8.015994433829164),
    ('poisson', 10, 50, 0.7, 1, 7,
     9.695770438805255, 6.325973878256633, 1.3693535507325367, 16.772227766845482),
    ('poisson', 10, 50, 0.7, 1, 93,
     30.022492124958713, 33.02289163872175, 4.991235327509527, 68.60886043740399),
    ('poisson', 10, 50, 0.7, 38, 1,
     19.145655146486604, 18.064729785394544, 3.1904972201466526, 39.411778924337106),
    ('poisson', 10, 50, 0.7, 38, 7,
     55.10221391029839, 70.82062084641679, 8.441262203150938, 141.54929349810527),
    ('poisson', 10, 50, 0.7, 38, 93,
     362.2573284316794, 603.6222576818986, 30.768040945013173, 1185.4562439503038),
    ('poisson', 10, 50, 1.1, 1, 1,
     2.412256087937665, 0.8322823971508584, 0.22673185870488588, 3.5824862428829816),
    ('poisson', 10, 50, 1.1, 1, 7,
     4.289558870472716, 2.444355991474363, 0.5998761124285633, 7.345945929456232),
    ('poisson', 10, 50, 1.1, 1, 93,
     13.068216987016932, 11.163983466164527, 2.1865228617407197, 28.68797316763614),
    ('poisson', 10, 50, 1.1, 38, 1,
     8.436735711665229, 6.481620970357907, 1.397669044719582, 17.01942013407136),
    ('poisson', 10, 50, 1.1, 38, 7,
     23.46110111452517, 21.945991109725085, 3.6978847075012276, 56.855646697989634),
    ('poisson', 10, 50, 1.1, 38, 93,
     136.8268658604208, 147.4536961901886, 13.478632146726293, 420.64577844845843),
    ('poisson', 10, 50, 2.5, 1, 1,
     0.5815872541725203, 0.2792232527378944, 0.08330927223108128, 0.9178688587747196),
    ('poisson', 10, 50, 2.5, 1, 7,
     1.1462994067876817, 0.8069283235562683, 0.22041561622922018, 2.145144179429828),
    ('poisson', 10, 50, 2.5, 1, 93,
     3.939660748842333, 3.4033987918848916, 0.8034055265490361, 8.471364590348934),
    ('poisson', 10, 50, 2.5, 38, 1,
     2.491096163305574, 2.0535437905665033, 0.513552844318432, 5.129736774140886),
    ('poisson', 10, 50, 2.5, 38, 7,
     6.990818461340876, 6.267820961251276, 1.358733111156441, 15.884524184137621),
    ('poisson', 10, 50, 2.5, 38, 93,
     34.487136387808256, 32.66676955825413, 4.952524277921543, 93.42857013516387),
]

#: (sampler, B, n, K, R, target ε, budget_accounting, σ_j for K steps, K_j ≤ 4K at 1.1·σ_j),
#: computed on 57bba37 with calibrate_noise / calibrate_steps.
CALIBRATION = [
    ('wor', 16, 600, 38, 20, 2.0, 'rigorous', 8.309132110541722, 43),
    ('wor', 16, 600, 38, 20, 2.0, 'clt', 3.7457581565526117, 48),
    ('wor', 64, 1000, 10, 50, 0.8, 'rigorous', 222.2002469909655, 12),
    ('wor', 10, 50, 5, 10, 4.0, 'rigorous', 16.373512123340586, 6),
    ('poisson', 32, 500, 20, 30, 3.0, 'clt', 2.2884574753639075, 24),
    ('poisson', 32, 500, 20, 30, 3.0, 'rigorous', 2.511718753981375, 24),
    ('poisson', 8, 66, 8, 30, 6.0, 'rigorous', 1.7588459931093092, 10),
]


def _ledger(plan: LocalStepsPlan, rate: float, participations: int, n: int = 3) -> PrivacyLedger:
    """A client's ledger of ``n`` records charged ``participations`` times (state, as on
    resume)."""
    ledger = PrivacyLedger(np.full(n, 1e6), np.full(n, rate), plan, ids=[11, 12, 13][:n],
                           orders=None)
    every = np.full(n, participations, dtype=np.int64)
    ledger.load_state_dict({"third_party_rounds": every, "server_rounds": every,
                            "sat_out_rounds": np.zeros(n, dtype=np.int64),
                            "rounds_recorded": participations})
    return ledger


@pytest.mark.parametrize(("sampler", "b", "n", "sigma", "k", "rounds", "eps", "clt", "mu",
                          "strong"), EPSILON)
def test_the_ledgers_epsilon_is_the_first_releases(
    sampler, b, n, sigma, k, rounds, eps, clt, mu, strong
) -> None:
    plan = LocalStepsPlan(sampler, sigma, k, DELTA, rounds)
    rate = b / n
    ledger = _ledger(plan, rate, rounds)
    spent = {o: ledger.spent_epsilon(o) for o in ("third-party", "server")}
    # the CLT (gdp-clt accountant, labelled approximate): bit for bit, both samplers
    np.testing.assert_array_equal(ledger.spent_epsilon("both", accountant="gdp-clt"), clt)
    assert clt_mu(plan, rate, rounds) == mu
    assert epsilon(plan, rate, rounds, "clt") == clt
    if sampler == "wor":
        # Theorem 9 on the integer orders: bit for bit, every observer
        for observer in spent:
            np.testing.assert_array_equal(spent[observer], eps)
        assert epsilon(plan, rate, rounds) == eps
        assert strong_epsilon(plan, rate, rounds, 5) == strong
        assert mechanism_epsilon(plan, [rate], "third-party", rounds)[1][0] in WOR_ORDERS
    else:
        # the grid minimum (to float rounding of the composition) ...
        grid, _ = mechanism_epsilon(plan, [rate], "third-party", rounds, refine=False)
        assert grid[0] == pytest.approx(eps, rel=1e-15, abs=0)
        # ... and the ledger's refined order is never looser (still an upper bound)
        for observer in spent:
            assert np.all(spent[observer] <= eps) and np.all(spent[observer] >= eps * 0.95)
        assert strong_epsilon(plan, rate, rounds, 5) <= strong
    # the summary: rigorous headline, the CLT beside it, labelled
    summary = ledger.summary(approximate="gdp-clt")
    assert summary.spent_max("server") == spent["server"].max()
    assert summary.approximate["gdp-clt_epsilon_max_server"] == clt


def test_no_participation_spends_nothing() -> None:
    plan = LocalStepsPlan("wor", 1.0, 38, DELTA, 10)
    ledger = _ledger(plan, 16 / 600, 0)
    assert np.all(ledger.spent_epsilon("both") == 0.0)
    assert clt_mu(plan, 16 / 600, 0) == 0.0 and epsilon(plan, 16 / 600, 0) == 0.0


def _setup(sampler: str, k: int, rounds: int, accounting: str, sigma: float | None,
           calibrate: str = "noise") -> PriFedSyncSetup:
    return PriFedSyncSetup(
        sampler=sampler, alpha=0.1, server_lr=1.0, client_rate=1.0, local_steps=k,
        local_epoch=False, rounds=rounds, planned_rounds=rounds, max_grad_norm=1.0,
        noise_multiplier=sigma, delta=DELTA, num_clients=10, calibrate=calibrate,
        budget_accounting=accounting,
    )


@pytest.mark.parametrize(("sampler", "b", "n", "k", "rounds", "eps", "accounting", "sigma",
                          "steps"), CALIBRATION)
def test_calibrated_noise_and_steps_are_the_first_releases(
    sampler, b, n, k, rounds, eps, accounting, sigma, steps
) -> None:
    plan, rate = client_plan(_setup(sampler, k, rounds, accounting, None), n, b, eps)
    assert plan.noise_multiplier == sigma and plan.local_steps == k and rate == b / n
    assert epsilon(plan, rate, rounds, accounting) <= eps
    # the ledger charged the planned participations holds exactly what was certified
    if accounting == "rigorous":
        spent = _ledger(plan, rate, rounds).spent_epsilon("both")
        assert np.all(spent <= eps)
    by_steps, _ = client_plan(_setup(sampler, 4 * k, rounds, accounting, sigma * 1.1, "steps"),
                              n, b, eps)
    assert by_steps.local_steps == steps and by_steps.noise_multiplier == sigma * 1.1
    assert epsilon(by_steps, rate, rounds, accounting) <= eps


# ------------------------------------------------------------------ ids, in a run and on resume


def _tiny(*overrides: str):
    from pdpfl.config import config_from_dict

    raw = dict(
        name="pfs-ids", seed=4, threads=1, randomness="reproducible",
        data=dict(dataset="digits", num_clients=3),
        model=dict(name="logreg"),
        algorithm=dict(name="prifedsync", target_epsilon=[2.0, 4.0, None], planned_rounds=2),
        privacy=dict(noise_multiplier=2.0, delta=DELTA),
        training=dict(rounds=3, local_steps=3, client_rate=1.0, lr=0.1, batch_size=16),
    )
    return config_from_dict(raw, list(overrides))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_record_ids_key_the_ledgers_and_survive_resume_and_extension(tmp_path) -> None:
    import pdpfl
    from pdpfl.ledger import load_ledger
    from pdpfl.runtime.simulation import load_federation_for, run_simulation

    config = _tiny()
    federation = load_federation_for(config)
    out = tmp_path / "run"
    run_simulation(config, out, progress=False, stop_after=2)
    summary = run_simulation(config, out, resume=True, progress=False)
    assert summary["rounds_completed"] == 3
    for cid, client in enumerate(federation.clients):
        ledger = load_ledger(out / "ledgers" / f"client_{cid}.npz")
        np.testing.assert_array_equal(ledger.ids, client.record_ids)
        assert ledger.unit == "record" and isinstance(ledger.mechanism, LocalStepsPlan)
    table = pdpfl.privacy_table(out, as_frame=False)
    # every client joined every round its ledger allowed: targets stop after 2, no target never
    rounds = {h: set(table["rounds_server"][table["holder"] == h]) for h in set(table["holder"])}
    assert rounds == {"client_0": {2}, "client_1": {2}, "client_2": {3}}
    assert np.all(table["stopped"][table["holder"] != "client_2"])
    assert not np.any(table["stopped"][table["holder"] == "client_2"])
    first = str(federation.clients[1].record_ids[0])
    assert table["budget"][table["id"] == first].tolist() == [4.0]
    # extended by one round: same ids, client 2 (no target) stops at its planned ε
    longer = run_simulation(_tiny("rounds=4"), out, resume=True, progress=False)
    after = pdpfl.privacy_table(out, as_frame=False)
    assert longer["rounds_completed"] == 4
    np.testing.assert_array_equal(after["id"], table["id"])
    assert set(after["rounds_server"][after["holder"] == "client_2"]) == {3}
    assert np.all(after["epsilon_server"] <= after["budget"])
    assert longer["neighbouring"].startswith("replace one record")
