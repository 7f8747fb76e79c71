"""The quickstart's private corpus: invented office e-mail sentences.

Written for leakjax (no real people or messages): each sentence is short
(< 40 tokens) and names a person, company, place, product or event, like
the Enron sentences FILM attacks (Appendix B.1). The quickstart fine-tunes
a model on them and then tries to recover them from client gradients.
The FILM and DAGER experiments attack these sentences when no `--data`
is given.
"""

SENTENCES = (
  'Marta Lindqvist will present the Oslo budget to the board on Friday.',
  'Please send the signed Harwick contract to Daniel Okafor before noon.',
  'The Denver pipeline outage delayed three shipments for Castell Energy.',
  'Priya Raman asked whether the Boston office can host the spring review.',
  'Our meeting with Talbot Freight moved to Tuesday at the Chicago site.',
  'Greg Whitfield approved the new storage deal with Northgate Partners.',
  'The Zephyr laptop order for the Austin team has not arrived yet.',
  'Can you confirm that Lena Novak booked the flight to Calgary?',
  'Tom Brennan needs the revised gas schedule for the Houston plant.',
  'The Redmond auditors want every invoice from Brightwater Labs by Monday.',
  'Sofia Marchetti will call you about the Lisbon lease tomorrow morning.',
  'We lost the Pemberton bid because the price from Kestrel Oil was lower.',
  'Ahmed Siddiqui is the new contact for all Orion Logistics questions.',
  'The Vancouver conference starts on Wednesday with a keynote by Ines Duarte.',
  'Kevin Moreau forgot the access badge for the Dallas trading floor again.',
  'Please forward the Summit Power memo to Rachel Kim and her team.',
  'The Glasgow warehouse will close early for the Highland Games weekend.',
  'Nadia Petrova signed off on the Atlas software upgrade last night.',
  'Our lawyers at Fenwick and Moss still have questions about the merger.',
  'Jonas Eriksen wants a summary of the Phoenix trades by the end of day.',
  'The Seattle team will test the Comet billing system next week.',
  'Carla Mendes left a voicemail about the missing Toronto payment.',
  'Is Victor Lang still in charge of the Tulsa compression project?',
  'The Harborview dinner with Mayor Ellen Price is set for seven.',
  'Hugo Bernard reported a leak at the Midland storage field this morning.',
  'Send the quarterly numbers for Blue Ridge Gas to Emily Carter.',
  'The Madrid office ordered fifty Nimbus phones for the sales staff.',
  'Oliver Grant cannot attend the Phoenix retreat because of a family event.',
  'We should ask Westbrook Capital for a longer payment window.',
  'Aisha Bello booked the Omaha conference room for the whole afternoon.',
  'The Sapphire turbine at the Baton Rouge plant failed its inspection.',
  'Frank Delaney wants to renegotiate the Calpine transport rates.',
  'Julia Hoffmann moved the Frankfurt call to nine in the morning.',
  'The Riverside project needs approval from Dominic Shaw by Thursday.',
  'Ingrid Solberg sent the draft agreement for the Bergen terminal.',
  'Please remind Marcus Reid that the Atlanta audit begins on Monday.',
  'The Northwind pipeline crew found corrosion near the Odessa valve.',
  'Elena Vasquez will cover the Miami desk while Paul Turner is away.',
  'Our account at First Prairie Bank was charged twice for the same wire.',
  'Samuel Osei asked for the Lagos shipping documents by tomorrow.',
  'The London team celebrates the Kensington launch on Saturday night.',
  'Hannah Lee needs a new password for the Falcon reporting tool.',
  'The board of Granite Utilities meets in Pittsburgh next month.',
  'Rafael Costa confirmed that the Santos cargo left the port today.',
  'Please ask Diane Foster about the Portland meter readings.',
  'The Meridian deal with Apex Chemicals closes at the end of March.',
  'Yuki Tanaka will translate the Osaka contract before the call.',
  'Brian Walsh said the Cheyenne compressor is back online.',
  'The Everest backup servers in Phoenix were down for two hours.',
  'Laura Schmidt invited the whole Munich team to the Oktoberfest lunch.',
)

__all__ = ['SENTENCES']
